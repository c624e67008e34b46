package engine

import (
	"encoding/json"
	"strconv"
	"strings"
)

// decoder is one step of HF's decode_chain: it rewrites the list of token strings.
type decoder interface {
	decodeChain(tokens []string) []string
}

type byteLevelDec struct{ t *byteLevelTables }

func (d byteLevelDec) decodeChain(tokens []string) []string {
	var buf []byte
	for _, tok := range tokens {
		if b, ok := d.t.toBytes(tok); ok {
			buf = append(buf, b...)
		} else {
			// HF keeps the raw UTF-8 of a token that is not in the byte alphabet.
			buf = append(buf, tok...)
		}
	}
	return []string{utf8Lossy(buf)}
}

type byteFallbackDec struct{}

func (byteFallbackDec) decodeChain(tokens []string) []string {
	out := make([]string, 0, len(tokens))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if s := string(pending); validUTF8(s) == s {
			out = append(out, s)
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, tok := range tokens {
		if len(tok) == 6 && strings.HasPrefix(tok, "<0x") && tok[5] == '>' {
			if b, err := strconv.ParseUint(tok[3:5], 16, 8); err == nil {
				pending = append(pending, byte(b))
				continue
			}
		}
		flush()
		out = append(out, tok)
	}
	flush()
	return out
}

type fuseDec struct{}

func (fuseDec) decodeChain(tokens []string) []string { return []string{strings.Join(tokens, "")} }

type replaceDec struct {
	pattern, content string
}

func (d replaceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = strings.ReplaceAll(t, d.pattern, d.content)
	}
	return out
}

// stripDec removes up to start leading and stop trailing occurrences of content from each token.
type stripDec struct {
	content     string
	start, stop int
}

func (d stripDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		for k := 0; k < d.start && strings.HasPrefix(t, d.content); k++ {
			t = t[len(d.content):]
		}
		for k := 0; k < d.stop && strings.HasSuffix(t, d.content); k++ {
			t = t[:len(t)-len(d.content)]
		}
		out[i] = t
	}
	return out
}

type metaspaceDec struct {
	repl   string
	scheme string
}

func (d metaspaceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		// HF drops every replacement rune of the first token (not only a leading one).
		if i == 0 && d.scheme != "never" {
			out[i] = strings.ReplaceAll(t, d.repl, "")
		} else {
			out[i] = strings.ReplaceAll(t, d.repl, " ")
		}
	}
	return out
}

type decSequence []decoder

func (d decSequence) decodeChain(tokens []string) []string {
	for _, x := range d {
		tokens = x.decodeChain(tokens)
	}
	return tokens
}

func buildDecoder(raw json.RawMessage, bl *byteLevelTables) (decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	c, err := parseComponent(raw)
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return byteLevelDec{bl}, nil
	case "ByteFallback":
		return byteFallbackDec{}, nil
	case "Fuse":
		return fuseDec{}, nil
	case "Strip":
		return stripDec{c.Content, c.Start, c.Stop}, nil
	case "Replace":
		if c.Pattern == nil || c.Pattern.String == nil {
			return nil, unsupported("decoder", "Replace with a regex pattern")
		}
		return replaceDec{*c.Pattern.String, c.Content}, nil
	case "Metaspace":
		d := metaspaceDec{repl: c.Replacement, scheme: c.PrependScheme}
		if d.repl == "" {
			d.repl = "\u2581"
		}
		if d.scheme == "" {
			d.scheme = "always"
			if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
				d.scheme = "never"
			}
		}
		return d, nil
	case "Sequence":
		var seq decSequence
		for _, r := range c.Decoders {
			d, err := buildDecoder(r, bl)
			if err != nil {
				return nil, err
			}
			if d != nil {
				seq = append(seq, d)
			}
		}
		return seq, nil
	}
	return nil, unsupported("decoder", c.Type)
}
