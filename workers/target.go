package workers

import "github.com/kvgate/kvgate/kvkey"

// Target is one routing target, a worker and one of its data-parallel ranks. It is defined in
// the leaf package kvkey; this alias keeps the fleet's existing references working.
type Target = kvkey.Target
