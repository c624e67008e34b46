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
}

// Policy selects one target among candidates. Candidates is never empty when Pick is called;
// implementations must be safe for concurrent use.
type Policy interface {
	Name() string
	Pick(ctx context.Context, req *Request, candidates []Candidate) (Decision, error)
}
