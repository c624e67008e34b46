package sim

// Media of KV events (the values vLLM's block pool and offloading connector publish).
const (
	mediumGPU = "GPU"
	mediumCPU = "CPU"
)

type eventKind uint8

const (
	evStored eventKind = iota + 1
	evRemoved
	evCleared
)

// kvEvent is one block-pool or host-tier event in the simulator's own form; the wire encoder
// of package indexers turns batches of them into vLLM's msgpack bytes.
type kvEvent struct {
	kind      eventKind
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	blockSize int
	loraID    int // 0 = none
	loraName  string
	medium    string
	extra     [][]string // per block; nil entry = no extra keys; nil slice = field omitted
	sessionID string
	// placeholder marks a token-less host-tier event (no extra keys, group or spec kind).
	placeholder bool
}
