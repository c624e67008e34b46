package engine

// GPT-2 byte-level alphabet: every byte maps to a printable rune so that byte strings can live in
// a JSON vocabulary. Printable Latin-1 bytes map to themselves, the others to U+0100 onwards.

// byteLevelTables holds both directions of the mapping.
type byteLevelTables struct {
	byteToRune [256]rune
	runeToByte map[rune]byte
}

func newByteLevelTables() *byteLevelTables {
	t := &byteLevelTables{runeToByte: make(map[rune]byte, 256)}
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t.byteToRune[b] = rune(b)
		} else {
			t.byteToRune[b] = rune(256 + n)
			n++
		}
		t.runeToByte[t.byteToRune[b]] = byte(b)
	}
	return t
}

// toBytes maps a byte-level token string back to raw bytes; ok is false when some rune is not in
// the alphabet.
func (t *byteLevelTables) toBytes(s string) (out []byte, ok bool) {
	out = make([]byte, 0, len(s))
	for _, r := range s {
		b, found := t.runeToByte[r]
		if !found {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}
