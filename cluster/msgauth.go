package cluster

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Replica messages are authenticated end to end with the fleet key (cluster.fleet_key_file),
// so that a client with access to the bus but not the key cannot move routing, rebind sessions
// or install an index snapshot. Every core-NATS message a replica sends (load, approx, leave,
// snapshot offers, requests and replies) carries the header
//
//	Kvgate-Auth: v1 <unix ms> <hex HMAC-SHA256>
//
// over a domain tag, the subject it was published on, its reply subject (a request's answer
// goes only where the signer asked), the time and the body; key-value
// entries (session bindings, pins) carry the MAC in their JSON value, over the bucket, the key
// and every field, the time included. The subject binds the sender's replica id (load
// subjects end with it; the body names it again with its epoch and sequence number), and the
// time bounds replay: a message whose time is further than cluster.message_window from the
// receiver's clock is dropped; within it, load messages are ordered by (epoch, seq) and an
// old one is stale (router.PeerLoads), a binding's time must match the time the NATS server
// stored it, and snapshot replies go to a fresh inbox per request. A message that fails is
// dropped and counted (kvgate_cluster_unauthenticated_messages_total{kind}).
//
// With no fleet key (the default, for compatibility) nothing is signed or checked, and Start
// warns: anyone who can reach the bus can steer the fleet.

// authHeader is the header carrying a core-NATS message's MAC.
const authHeader = "Kvgate-Auth"

// minFleetKey is the shortest fleet key accepted (bytes of the file, whitespace trimmed).
const minFleetKey = 32

// fleetKey signs and checks replica messages; a nil *fleetKey signs nothing and accepts all.
type fleetKey struct {
	key    []byte
	window time.Duration
	now    func() time.Time
}

// loadFleetKey reads the key file: its bytes, surrounding whitespace trimmed (e.g. the output
// of `openssl rand -hex 32`).
func loadFleetKey(path string, window time.Duration) (*fleetKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster.fleet_key_file: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < minFleetKey {
		return nil, fmt.Errorf("cluster.fleet_key_file: %s holds %d bytes, want at least %d (e.g. openssl rand -hex 32)", path, len(b), minFleetKey)
	}
	return &fleetKey{key: b, window: window, now: time.Now}, nil
}

// mac is HMAC-SHA256 over the parts, each length-prefixed so no two part lists collide.
func (k *fleetKey) mac(parts ...[]byte) []byte {
	h := hmac.New(sha256.New, k.key)
	var n [8]byte
	for _, p := range parts {
		binary.LittleEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return h.Sum(nil)
}

// fresh reports whether a message time (unix ms) is within the window of now.
func (k *fleetKey) fresh(ms int64) bool {
	d := k.now().Sub(time.UnixMilli(ms))
	return d <= k.window && d >= -k.window
}

// signMsg sets m's auth header for its subject, data and the current time.
func (k *fleetKey) signMsg(m *nats.Msg) {
	if k == nil {
		return
	}
	ms := k.now().UnixMilli()
	ts := strconv.FormatInt(ms, 10)
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header.Set(authHeader, "v1 "+ts+" "+hex.EncodeToString(k.mac([]byte("msg"), []byte(m.Subject), []byte(m.Reply), []byte(ts), m.Data)))
}

// Reasons a message fails authentication.
var (
	errUnsigned = errors.New("no fleet-key signature")
	errBadMAC   = errors.New("fleet-key signature does not match")
	errStale    = errors.New("signed outside cluster.message_window (a replay, or clocks apart)")
)

// checkMsg verifies m's auth header against the subject it arrived on.
func (k *fleetKey) checkMsg(m *nats.Msg) error {
	if k == nil {
		return nil
	}
	v := m.Header.Get(authHeader)
	if v == "" {
		return errUnsigned
	}
	f := strings.Fields(v)
	if len(f) != 3 || f[0] != "v1" {
		return errBadMAC
	}
	ms, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return errBadMAC
	}
	got, err := hex.DecodeString(f[2])
	if err != nil || !hmac.Equal(got, k.mac([]byte("msg"), []byte(m.Subject), []byte(m.Reply), []byte(f[1]), m.Data)) {
		return errBadMAC
	}
	if !k.fresh(ms) {
		return errStale
	}
	return nil
}

// kvMAC is the MAC of a key-value entry: bucket, key and the value's fields in order.
func (k *fleetKey) kvMAC(bucket, key string, fields ...string) string {
	parts := make([][]byte, 0, 3+len(fields))
	parts = append(parts, []byte("kv"), []byte(bucket), []byte(key))
	for _, f := range fields {
		parts = append(parts, []byte(f))
	}
	return hex.EncodeToString(k.mac(parts...))
}

// checkKV verifies a key-value entry's MAC and that its signed time (unix ms) is within the
// window of stored, the time the NATS server stored it: a valid entry written again later (a
// replay of an old binding) carries its old time and fails.
func (k *fleetKey) checkKV(mac string, at int64, stored time.Time, bucket, key string, fields ...string) error {
	if k == nil {
		return nil
	}
	if mac == "" {
		return errUnsigned
	}
	got, err := hex.DecodeString(mac)
	want, _ := hex.DecodeString(k.kvMAC(bucket, key, fields...))
	if err != nil || !hmac.Equal(got, want) {
		return errBadMAC
	}
	if d := stored.Sub(time.UnixMilli(at)); d > k.window || d < -k.window {
		return errStale
	}
	return nil
}
