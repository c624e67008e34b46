package kvkey

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// hashedIDPrefix starts every session id the gateway stores (HashSessionID).
const hashedIDPrefix = "sh-"

// hashedIDLen is the length of a HashSessionID result: the prefix and 16 bytes in hex.
const hashedIDLen = len(hashedIDPrefix) + 32

// HashSessionID is the form of a session id everywhere the gateway keeps or shows one: the tracker,
// the fleet's shared bindings, logs, debug views, the access log and the X-Session-ID sent to
// workers. It is "sh-" and the first 16 bytes of the SHA-256 of the id, in hex: the same on
// every replica, so they agree on a session, while what a client sent (a conversation id, or
// Claude Code's metadata.user_id with its device id) never leaves the request. An id already
// in that form is returned as is: a worker echoes the forwarded id on its KV events, and
// hashing it again must not make it another session. "" stays "".
func HashSessionID(id string) string {
	if id == "" || IsHashedSessionID(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return hashedIDPrefix + hex.EncodeToString(sum[:16])
}

// IsHashedSessionID reports whether id has HashSessionID's form.
func IsHashedSessionID(id string) bool {
	if len(id) != hashedIDLen || !strings.HasPrefix(id, hashedIDPrefix) {
		return false
	}
	for _, c := range id[len(hashedIDPrefix):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
