package bench

import "testing"

func TestPooledLRU(t *testing.T) {
	type step struct {
		ns      string
		ids     []int64
		wantHit int
		forget  bool // then forget the blocks this touch added (a request that failed unserved)
	}
	cases := []struct {
		name     string
		capacity int
		steps    []step
	}{
		{"room for everything is the theoretical hit", 100, []step{
			{"a", []int64{1, 2, 3}, 0, false}, {"a", []int64{1, 2, 3, 4}, 3, false}, {"a", []int64{1, 5}, 1, false},
		}},
		{"namespaces never share blocks", 100, []step{
			{"a", []int64{1, 2}, 0, false}, {"b", []int64{1, 2}, 0, false}, {"a", []int64{1, 2}, 2, false},
		}},
		{"the least recently used prompt is evicted", 4, []step{
			{"a", []int64{1, 2}, 0, false}, {"a", []int64{3, 4}, 0, false}, {"a", []int64{5, 6}, 0, false},
			{"a", []int64{3, 4}, 2, false}, {"a", []int64{1, 2}, 0, false},
		}},
		{"a prompt's tail goes before its head", 3, []step{
			// 1,2,3 then 4 evicts 3 (the tail of the older prompt), not 1: the prefix 1,2 still hits.
			{"a", []int64{1, 2, 3}, 0, false}, {"a", []int64{4}, 0, false}, {"a", []int64{1, 2, 3}, 2, false},
		}},
		{"a prompt larger than the cache keeps only its head", 2, []step{
			{"a", []int64{1, 2, 3, 4}, 0, false}, {"a", []int64{1, 2, 3, 4}, 2, false},
		}},
		{"a forgotten request's new blocks are no hit, the blocks it found stay", 100, []step{
			{"a", []int64{1, 2}, 0, false}, {"a", []int64{1, 2, 3, 4}, 2, true}, {"a", []int64{1, 2, 3, 5}, 2, false},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newPooledLRU(tc.capacity)
			for i, s := range tc.steps {
				got, added := c.touch(s.ns, s.ids)
				if got != s.wantHit {
					t.Fatalf("step %d (%s %v): hit %d, want %d", i, s.ns, s.ids, got, s.wantHit)
				}
				if s.forget {
					c.forget(s.ns, added)
				}
				if c.order.Len() > tc.capacity || len(c.where) != c.order.Len() {
					t.Fatalf("step %d: %d resident, %d indexed, capacity %d", i, c.order.Len(), len(c.where), tc.capacity)
				}
			}
		})
	}
}
