package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/kvkey"
)

// An embedded server with users: an outside client without credentials is refused; one with a
// fleet user's credentials cannot delete the fleet's buckets or read another fleet; and the
// replicas themselves, signed in as fleet users, run bindings, pins, load and snapshots
// without a single permission violation.
func TestEmbeddedUsers(t *testing.T) {
	srvCfg := embeddedConfig(t, "srv")
	srvCfg.Fleet = "f"
	srvCfg.EmbeddedNATS.Users = []clusterconfig.User{{User: "kvgate", Password: "s3cret"}, {User: "ops", Password: "0ps"}}
	srv := startNode(t, srvCfg)
	eventually(t, 5*time.Second, "the server's own replica signs in as the first user", srv.Connected)
	url := "nats://" + srvCfg.EmbeddedNATS.Listen

	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("a client without credentials was accepted")
	}
	if nc, err := nats.Connect(url, nats.UserInfo("kvgate", "wrong")); err == nil {
		nc.Close()
		t.Fatal("a wrong password was accepted")
	}

	replica := func(id string) *Node {
		c := replicaConfig(srvCfg, id, time.Minute)
		c.Fleet = "f"
		c.NATSUser, c.NATSPassword = "ops", "0ps"
		n := startNode(t, c)
		eventually(t, 5*time.Second, id+" connects", n.Connected)
		return n
	}
	na, nb := replica("a"), replica("b")
	a := startBindings(t, na, BindingsOptions{})
	b := startBindings(t, nb, BindingsOptions{})
	a.Routed("s1", "", wA)
	eventually(t, 3*time.Second, "b learns a's binding", lookupIs(b, "s1", wA))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.SharePin(ctx, "resp_1", wB); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := b.LookupPin(ctx, "resp_1"); err != nil || !ok || got != wB {
		t.Fatalf("pin: %v %v %v", got, ok, err)
	}
	la, err := startLoadSync(ctx, na, na.Conn(), LoadSyncOptions{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(la.Close)
	lb, err := startLoadSync(ctx, nb, nb.Conn(), LoadSyncOptions{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Close)
	eventually(t, 3*time.Second, "b hears a's load", func() bool { return lb.Peers().Len() == 1 })
	tg := kvkey.Target{Worker: "http://w"}
	sa, err := NewSnapshots(na, &fakeSource{snaps: map[kvkey.Target][]byte{tg: []byte("state")}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sa.Close)
	sb, err := NewSnapshots(nb, &fakeSource{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.Close)
	_ = na.Conn().Flush()
	if data, peer, err := sb.FetchSnapshot(ctx, tg); err != nil || string(data) != "state" || peer != "a" {
		t.Fatalf("snapshot: %q from %q: %v", data, peer, err)
	}
	for _, n := range []*Node{srv, na, nb} {
		if st := n.Status(); strings.Contains(strings.ToLower(st.LastError), "permission") {
			t.Fatalf("%s: %s", n.ReplicaID(), st.LastError)
		}
	}

	// An outside client holding a fleet user's password still cannot delete the buckets.
	var asyncErr = make(chan error, 4)
	evil, err := nats.Connect(url, nats.UserInfo("ops", "0ps"), nats.CustomInboxPrefix(inboxPrefix("f")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { asyncErr <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	js, err := jetstream.New(evil)
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer dcancel()
	if err := js.DeleteKeyValue(dctx, na.Bucket("sessions")); err == nil {
		t.Fatal("a fleet user deleted the sessions bucket")
	}
	if _, err := evil.SubscribeSync("kvgate.v1.otherfleet.>"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-asyncErr:
		if !strings.Contains(strings.ToLower(err.Error()), "permission") {
			t.Fatalf("another fleet's subjects: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("subscribing to another fleet's subjects was not refused")
	}
}

func TestEmbeddedToken(t *testing.T) {
	c := embeddedConfig(t, "srv")
	c.EmbeddedNATS.Token = "t0ken-t0ken"
	n := startNode(t, c)
	eventually(t, 5*time.Second, "the replica signs in with the token", n.Connected)
	url := "nats://" + c.EmbeddedNATS.Listen
	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("a client without the token was accepted")
	}
	nc, err := nats.Connect(url, nats.Token("t0ken-t0ken"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

// A listen address without a host binds loopback, not every interface.
func TestEmbeddedBindsLoopback(t *testing.T) {
	c := embeddedConfig(t, "srv")
	_, port, _ := net.SplitHostPort(c.EmbeddedNATS.Listen)
	c.EmbeddedNATS.Listen = ":" + port
	n := startNode(t, c)
	addr, ok := n.embedded.srv.Addr().(*net.TCPAddr)
	if !ok || !addr.IP.IsLoopback() {
		t.Fatalf("the embedded server listens on %v", n.embedded.srv.Addr())
	}
}

// writeTLS writes a CA and a certificate it signed for 127.0.0.1 (server and client use)
// into dir, returning the files.
func writeTLS(t *testing.T, dir string) clusterconfig.TLSFiles {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvgate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kvgate"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	f := clusterconfig.TLSFiles{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	for path, b := range map[string]*pem.Block{f.CAFile: {Type: "CERTIFICATE", Bytes: caDER},
		f.CertFile: {Type: "CERTIFICATE", Bytes: der}, f.KeyFile: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// TLS with a CA: the replica connects over TLS with its certificate, a client without one is
// refused; two embedded servers form their route over mutual TLS.
func TestEmbeddedTLS(t *testing.T) {
	files := writeTLS(t, t.TempDir())
	c := embeddedConfig(t, "srv")
	c.EmbeddedNATS.TLS = files
	n := startNode(t, c)
	eventually(t, 5*time.Second, "the replica connects over TLS", n.Connected)
	if !n.Conn().TLSRequired() {
		t.Fatal("the connection is not TLS")
	}
	url := "nats://" + c.EmbeddedNATS.Listen
	if nc, err := nats.Connect(url, nats.RootCAs(files.CAFile)); err == nil {
		nc.Close()
		t.Fatal("a client without a certificate was accepted")
	}

	// Two servers routed over TLS.
	p1, p2 := freePort(t), freePort(t)
	routes := []string{hostPort(p1), hostPort(p2)}
	seed := func(id string, route int) *Node {
		c := embeddedConfig(t, id)
		c.EmbeddedNATS.ClusterListen = "127.0.0.1:" + strconv.Itoa(route)
		c.EmbeddedNATS.Routes = routes
		c.EmbeddedNATS.TLS = files
		return startNode(t, c)
	}
	s1, s2 := seed("s1", p1), seed("s2", p2)
	eventually(t, 10*time.Second, "the TLS route forms", func() bool {
		return s1.embedded.srv.NumRoutes() > 0 && s2.embedded.srv.NumRoutes() > 0
	})
}
