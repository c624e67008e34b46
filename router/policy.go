package router

import (
	"context"
	"net/http"

	"github.com/kvgate/kvgate/kvkey"
)

// Request is what a policy sees of one request. Fields a policy does not need may be empty:
// the simple policies look only at the candidates, the kv policy at the block hashes too.
type Request struct {
	Model        string
	PromptTokens int
	BlockHashes  []kvkey.BlockHash // chained block hashes of the prompt's full blocks (tokenize.BlockHashes)
	// LocalHashes are the same blocks' unchained hashes (tokenize.LocalHashes), aligned with
	// BlockHashes, or nil. The event index remembers them for the chosen target to recover the
	// chain of stores whose parent it lost (indexers.Index.NoteRouted).
	LocalHashes     []uint64
	BlockSize       int
	SessionID       string
	ParentSessionID string
	// EndsSession is set when the request ends its session (X-Dynamo-Session-Final,
	// nvext.session_control.action "close"): its state is released once the request is over.
	EndsSession bool
	// Stream is set when the client asked for a streamed response. Only then does the
	// Lifecycle's FirstToken mark the first token; a non-stream body's first byte comes after
	// the whole generation, so the kv policy learns TTFT from streamed requests only.
	Stream bool
	// PinResponseID, when set, pins the request to the target that produced this Responses
	// API response (a previous_response_id, or the {id} of GET/DELETE/cancel): vLLM keeps the
	// response in that server's memory, so no other candidate may serve it (a hard pin; Route
	// fails with ErrUnknownResponse instead).
	PinResponseID string
	// Owner is the client key (its auth name) the request came with, "" without client keys.
	// Responses pins are the owner's: a pin made under one owner is unknown to every other
	// (pins.go, pinKey), so another key's GET, DELETE, cancel or previous_response_id gets 404.
	Owner  string
	Header http.Header
}

// Candidate is a healthy routing target the policy may choose, with the load the gateway sees.
type Candidate struct {
	kvkey.Target
	InFlight int // requests the gateway has in flight to this target
}

// CandidateScore is one row of a decision record: what the policy saw of a target.
type CandidateScore struct {
	kvkey.Target
	Mode     string  `json:"mode,omitempty"` // "events" or "approximate" for KV-aware policies
	G1Blocks int     `json:"g1_blocks"`
	G2Blocks int     `json:"g2_blocks"`
	G3Blocks int     `json:"g3_blocks"`
	Load     float64 `json:"load"`
	Cost     float64 `json:"cost"`
	// TTFTMs is the predicted time to first token alone, the part of Cost before the hint,
	// eviction, fleet and recompute terms (kv).
	TTFTMs float64 `json:"ttft_ms,omitempty"`
	// EvictMs is the part of Cost that prices the working-set blocks this prefill would evict
	// from the target's full KV cache (kv).
	EvictMs float64 `json:"evict_ms,omitempty"`
	// OverflowMs is the part of EvictMs that prices the rest of the target's overflow this
	// prompt's cached prefix shares in (kv, latency.overflow_weight).
	OverflowMs float64 `json:"overflow_ms,omitempty"`
	// RecomputeMs is the part of Cost that prices the prompt blocks this target would compute
	// that the best-cached candidate holds (kv, latency.recompute_weight).
	RecomputeMs float64 `json:"recompute_ms,omitempty"`
	// QueueLoss is the share of the cached prefix priced as uncached because the prefill
	// queued ahead on the target would evict it first (kv, latency.queue_loss_weight).
	QueueLoss float64 `json:"queue_loss,omitempty"`
	// Busy is set when the target was over a busy threshold (KV-aware policies).
	Busy bool `json:"busy,omitempty"`
}

// Choice names the chosen target and why it won.
type Choice struct {
	kvkey.Target
	Reason string `json:"reason"`
}

// Decision is the record of one routing decision.
type Decision struct {
	PromptTokens int              `json:"prompt_tokens"`
	PromptBlocks int              `json:"prompt_blocks"`
	Policy       string           `json:"policy"`
	Chosen       Choice           `json:"chosen"`
	Candidates   []CandidateScore `json:"candidates"`
	// Regret is set when another candidate had a longer G1 match than the chosen one.
	Regret *Regret `json:"regret,omitempty"`
	// Hold is set when the request found its prefix being prefilled on a target (sibling hold).
	Hold *HoldRecord `json:"hold,omitempty"`
}

// Regret is the cache a decision left unused: the best G1 overlap any candidate had minus the
// chosen target's, and why the choice differed.
type Regret struct {
	// Blocks is best G1 − chosen G1 (> 0).
	Blocks int `json:"blocks"`
	// Best is the candidate with the best G1 match, BestG1 that match.
	Best   kvkey.Target `json:"best"`
	BestG1 int          `json:"best_g1_blocks"`
	// Reason is why the chosen target won anyway: load (its predicted queue or load was lower),
	// busy (the best one was over a busy threshold), hint (a session rule decided),
	// temperature (a softmax draw), hold (held for a prefix in flight on the chosen target),
	// hold_expired (routed anew after a hold ran out).
	Reason string `json:"reason"`
}

// HoldRecord is what the sibling hold did for a request.
type HoldRecord struct {
	// Target is where the shared prefix was being prefilled; SharedBlocks how many leading
	// blocks of this prompt it covers.
	Target       kvkey.Target `json:"target"`
	SharedBlocks int          `json:"shared_blocks"`
	// Outcome: released (held, then sent to Target once the prefix was computed there),
	// cached (the shared prefix is already cached on a candidate: not held), expired (held
	// past its bound, routed anew), busy (Target over a busy threshold: not held), disabled
	// (router.hold.enabled false), faster_elsewhere (priced, Cost: another target computes the
	// whole prompt sooner than the wait plus the suffix; not held), leader_failed (the first
	// request ended without computing the prefix: routed anew), unrouted (the first request
	// was not routed in time), unavailable (Target is not a candidate). POST /debug/route,
	// which waits for nothing, says would_hold where a request would be held now.
	Outcome string `json:"outcome"`
	// WaitedMs is how long the request was held.
	WaitedMs float64 `json:"waited_ms"`
	// Cost is the priced choice between holding and routing elsewhere now, with its
	// predicted alternatives (kv; absent when the hold was not priced: the cases above
	// before it, or kv_blocks).
	Cost *HoldCost `json:"cost,omitempty"`
}

// Policy selects one target among candidates. Candidates is never empty when Pick is called;
// implementations must be safe for concurrent use.
type Policy interface {
	Name() string
	Pick(ctx context.Context, req *Request, candidates []Candidate) (Decision, error)
}
