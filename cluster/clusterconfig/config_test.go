package clusterconfig

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		set  func(*Config)
		want string // the error's key prefix; "" = valid
	}{
		{"defaults (no cluster)", func(*Config) {}, ""},
		{"external nats", func(c *Config) { c.NATSURL = "nats://10.0.0.1:4222,nats://10.0.0.2:4222" }, ""},
		{"embedded standalone", func(c *Config) { c.EmbeddedNATS.Listen = "127.0.0.1:4222" }, ""},
		{"embedded cluster", func(c *Config) {
			c.EmbeddedNATS.Listen, c.EmbeddedNATS.ClusterListen = "127.0.0.1:4222", "127.0.0.1:6222"
			c.EmbeddedNATS.Routes = []string{"127.0.0.1:6222", "nats-route://127.0.0.1:6223"}
			c.KVReplicas = 3
		}, ""},
		{"bad fleet", func(c *Config) { c.Fleet = "a.b" }, "fleet: "},
		{"empty fleet", func(c *Config) { c.Fleet = "" }, "fleet: "},
		{"bad replica id", func(c *Config) { c.ReplicaID = "x y" }, "replica_id: "},
		{"kv replicas 0", func(c *Config) { c.KVReplicas = 0 }, "kv_replicas: "},
		{"kv replicas 3 standalone", func(c *Config) { c.EmbeddedNATS.Listen = "127.0.0.1:4222"; c.KVReplicas = 3 }, "kv_replicas: "},
		{"short ttl", func(c *Config) { c.SessionTTL = 0 }, "session_ttl: "},
		{"zero deadline", func(c *Config) { c.KVDeadline = 0 }, "kv_deadline: "},
		{"zero load interval", func(c *Config) { c.LoadInterval = 0 }, "load_interval: "},
		{"peer timeout below interval", func(c *Config) { c.PeerTimeout = c.LoadInterval }, "peer_timeout: "},
		{"zero snapshot timeout", func(c *Config) { c.SnapshotTimeout = 0 }, "snapshot_timeout: "},
		{"bad url", func(c *Config) { c.NATSURL = "localhost" }, "nats_url: "},
		{"bad listen", func(c *Config) { c.EmbeddedNATS.Listen = "4222" }, "embedded_nats.listen: "},
		{"cluster listen without listen", func(c *Config) { c.EmbeddedNATS.ClusterListen = "127.0.0.1:6222" }, "embedded_nats.cluster_listen: "},
		{"routes without cluster listen", func(c *Config) {
			c.EmbeddedNATS.Listen = "127.0.0.1:4222"
			c.EmbeddedNATS.Routes = []string{"127.0.0.1:6222"}
		}, "embedded_nats.routes: "},
		{"bad route", func(c *Config) {
			c.EmbeddedNATS.Listen, c.EmbeddedNATS.ClusterListen = "127.0.0.1:4222", "127.0.0.1:6222"
			c.EmbeddedNATS.Routes = []string{"nowhere"}
		}, "embedded_nats.routes[0]: "},
		{"client user", func(c *Config) { c.NATSURL = "nats://x:4222"; c.NATSUser, c.NATSPassword = "u", "p" }, ""},
		{"user without password", func(c *Config) { c.NATSUser = "u" }, "nats_password: "},
		{"user and token", func(c *Config) { c.NATSUser, c.NATSPassword, c.NATSToken = "u", "p", "t" }, "nats_user: "},
		{"token and creds", func(c *Config) { c.NATSToken, c.NATSCreds = "t", "/x.creds" }, "nats_user: "},
		{"client cert without key", func(c *Config) { c.TLS.CertFile = "/c.pem" }, "tls.cert_file: "},
		{"embedded users", func(c *Config) {
			c.EmbeddedNATS.Listen = "127.0.0.1:4222"
			c.EmbeddedNATS.Users = []User{{User: "a", Password: "p"}, {User: "b", Password: "q"}}
		}, ""},
		{"embedded user twice", func(c *Config) {
			c.EmbeddedNATS.Listen = "127.0.0.1:4222"
			c.EmbeddedNATS.Users = []User{{User: "a", Password: "p"}, {User: "a", Password: "q"}}
		}, "embedded_nats.users[1]: "},
		{"embedded user without password", func(c *Config) { c.EmbeddedNATS.Users = []User{{User: "a"}} }, "embedded_nats.users[0]: "},
		{"embedded users and token", func(c *Config) {
			c.EmbeddedNATS.Users = []User{{User: "a", Password: "p"}}
			c.EmbeddedNATS.Token = "t"
		}, "embedded_nats.token: "},
		{"embedded tls ca only", func(c *Config) { c.EmbeddedNATS.TLS.CAFile = "/ca.pem" }, "embedded_nats.tls.cert_file: "},
		{"short message window", func(c *Config) { c.MessageWindow = 0 }, "message_window: "},
		{"tiny memory", func(c *Config) { c.EmbeddedNATS.Listen = "127.0.0.1:4222"; c.EmbeddedNATS.MaxMemory = 10 }, "embedded_nats.max_memory: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.set(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Fatalf("error %v, want prefix %q", err, tc.want)
			}
		})
	}
}

func TestEnabled(t *testing.T) {
	c := Default()
	if c.Enabled() {
		t.Fatal("the default must not cluster")
	}
	c.NATSURL = " nats://x:4222 "
	if !c.Enabled() || len(c.URLs()) != 1 || c.URLs()[0] != "nats://x:4222" {
		t.Fatalf("enabled %v urls %q", c.Enabled(), c.URLs())
	}
	c = Default()
	c.EmbeddedNATS.Listen = "127.0.0.1:4222"
	if !c.Enabled() {
		t.Fatal("an embedded server clusters")
	}
}
