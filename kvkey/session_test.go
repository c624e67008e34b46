package kvkey

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// HashSessionID is "sh-" and the first 16 bytes of SHA-256 in hex, and leaves a hashed id alone (a
// worker echoes the forwarded id on its KV events).
func TestHashSessionID(t *testing.T) {
	sum := sha256.Sum256([]byte("conv-1"))
	want := "sh-" + hex.EncodeToString(sum[:16])
	if h := HashSessionID("conv-1"); h != want || !IsHashedSessionID(h) {
		t.Fatalf("HashSessionID = %q, want %q", h, want)
	}
	if HashSessionID(want) != want || HashSessionID("") != "" || HashSessionID("conv-2") == want {
		t.Fatal("HashSessionID is not idempotent, or maps two ids alike")
	}
	for _, s := range []string{"sh-", "sh-0123", "sh-" + strings.Repeat("G", 32), "xx-" + strings.Repeat("0", 32), "sh-" + strings.Repeat("A", 32)} {
		if IsHashedSessionID(s) {
			t.Errorf("IsHashedSessionID(%q)", s)
		}
	}
}
