package kvkey

import "strconv"

// Target is one routing target: a worker (one vLLM server, named by its base URL as configured)
// and one of its data-parallel ranks (0 when the worker has no DP).
type Target struct {
	Worker string `json:"worker"`
	DPRank int    `json:"dp_rank"`
}

// String renders the target as "URL#rank", the form used in logs and metric labels.
func (t Target) String() string { return t.Worker + "#" + strconv.Itoa(t.DPRank) }
