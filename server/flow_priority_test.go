package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/flowcontrol"
	"github.com/kvgate/kvgate/kvkey"
)

func TestClassify(t *testing.T) {
	cfg := configs.Default()
	cfg.FlowControl.Objectives = map[string]int{"critical": 5, "sheddable": -5}
	s := &Server{cfg: cfg}
	gold := &tenant{name: "gold", priority: 3}
	cases := []struct {
		name         string
		tn           *tenant
		program      string
		header       map[string]string
		wantPrio     int
		wantTenant   string
		wantBadInput bool
	}{
		{"no keys, no header: priority 0, anonymous", nil, "", nil, 0, "", false},
		{"no keys: any priority may be asked", nil, "", map[string]string{"X-Kvgate-Priority": "7"}, 7, "", false},
		{"no keys: an objective maps", nil, "", map[string]string{"X-Gateway-Inference-Objective": "critical"}, 5, "", false},
		{"x-kvgate-priority wins over an objective", nil, "", map[string]string{"X-Kvgate-Priority": "-2", "X-Gateway-Inference-Objective": "critical"}, -2, "", false},
		{"an unknown objective changes nothing", gold, "", map[string]string{"X-Gateway-Inference-Objective": "other"}, 3, "key:gold", false},
		{"a key's priority", gold, "", nil, 3, "key:gold", false},
		{"a header may lower a key's priority", gold, "", map[string]string{"X-Kvgate-Priority": "1"}, 1, "key:gold", false},
		{"a header may not raise it", gold, "", map[string]string{"X-Kvgate-Priority": "50"}, 3, "key:gold", false},
		{"nor may an objective", gold, "", map[string]string{"X-Gateway-Inference-Objective": "critical"}, 3, "key:gold", false},
		{"malformed priority", nil, "", map[string]string{"X-Kvgate-Priority": "high"}, 0, "", true},
		{"priority out of range", nil, "", map[string]string{"X-Kvgate-Priority": "101"}, 0, "", true},
		{"without keys the program is the tenant", nil, "root-session", nil, 0, "program:root-session", false},
		{"without keys a fairness id names the tenant", nil, "root-session", map[string]string{"X-Gateway-Inference-Fairness-Id": "alice"}, 0, "fair:alice", false},
		{"under a key the fairness id splits the key's own share", gold, "root-session", map[string]string{"X-Gateway-Inference-Fairness-Id": "alice"}, 3, "key:gold/alice", false},
		{"a key cannot take another key's tenant", gold, "", map[string]string{"X-Gateway-Inference-Fairness-Id": "../silver"}, 3, "key:gold/../silver", false},
		{"under a key sessions share the key's tenant", gold, "root-session", nil, 3, "key:gold", false},
	}
	for _, tc := range cases {
		h := http.Header{}
		for k, v := range tc.header {
			h.Set(k, v)
		}
		cls, e := s.classify(h, tc.tn, tc.program)
		if (e != nil) != tc.wantBadInput {
			t.Errorf("%s: error %v, want one: %v", tc.name, e, tc.wantBadInput)
			continue
		}
		if e != nil {
			if e.Status != http.StatusBadRequest {
				t.Errorf("%s: status %d, want 400", tc.name, e.Status)
			}
			continue
		}
		if cls.priority != tc.wantPrio || cls.tenant != tc.wantTenant {
			t.Errorf("%s: got priority %d tenant %q, want %d %q", tc.name, cls.priority, cls.tenant, tc.wantPrio, tc.wantTenant)
		}
		// Named (cache protection between tenants): a key's or the fairness header's tenant,
		// never an agent program nor the anonymous one.
		if wantNamed := strings.HasPrefix(tc.wantTenant, "key:") || strings.HasPrefix(tc.wantTenant, "fair:"); cls.named != wantNamed {
			t.Errorf("%s: named %v, want %v", tc.name, cls.named, wantNamed)
		}
	}
}

// The tenant's attained service, charged prompt plus max_tokens at dispatch, becomes the
// worker's reported usage (weighted) once the response ends.
func TestFlowTicketCorrectsService(t *testing.T) {
	cfg := flowcontrol.Default()
	cfg.OutputWeight = 2
	g := &flowGate{cfg: cfg, q: flowcontrol.NewQueue[kvkey.Target](flowcontrol.LimitsOf(cfg), time.Now)}
	tk := &flowTicket{g: g, class: flowClass{tenant: "t"}, cost: 40 + 2*500}
	g.q.Charge("t", tk.cost)
	uc := &usageCapture{}
	uc.body([]byte(`{"usage":{"prompt_tokens":40,"completion_tokens":10,"total_tokens":50}}`))
	tk.correct(uc)
	if got := g.q.Service("t"); got < 59.9 || got > 60.1 {
		t.Fatalf("service after the usage = %v, want 40 + 2×10 = 60", got)
	}
	tk.correct(&usageCapture{}) // no usage reported: the estimate stays
	if got := g.q.Service("t"); got < 59.9 || got > 60.1 {
		t.Fatalf("a response without usage changed the service to %v", got)
	}
	(*flowTicket)(nil).correct(uc) // not through flow control
}
