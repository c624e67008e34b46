package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// variantsFile lists tokenizer.json variants that exercise the components the five models do
// not use (every Split behavior and invert, Digits, Punctuation, WhitespaceSplit, ByteLevel with
// prefix space and regex, Metaspace, Lowercase/Strip/Prepend/Replace-regex/NFD/NFKD/NFKC,
// lstrip/rstrip/single_word/normalized added tokens, RobertaProcessing, TemplateProcessing with
// two specials, Metaspace/Strip decoders). Their goldens come from HF tokenizers too.
type variantsFile struct {
	Variants []struct {
		Name        string                     `json:"name"`
		Base        string                     `json:"base"`
		Replace     map[string]json.RawMessage `json:"replace"`
		AddedTokens []map[string]any           `json:"added_tokens"`
	} `json:"variants"`
}

// buildVariant applies the same rules as scripts/goldens/gen-tokens.mjs.
func buildVariant(t *testing.T, base string, replace map[string]json.RawMessage, patches []map[string]any) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(modelsDir, base, "tokenizer.json"))
	if err != nil {
		skipOrFail(t, "models missing: run scripts/fetch-tokenizers.sh: %v", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatal(err)
	}
	for k, v := range replace {
		top[k] = v
	}
	var added []map[string]any
	if err := json.Unmarshal(top["added_tokens"], &added); err != nil {
		t.Fatal(err)
	}
	for _, p := range patches {
		i := slices.IndexFunc(added, func(a map[string]any) bool { return a["content"] == p["content"] })
		if i < 0 {
			added = append(added, p)
			continue
		}
		for k, v := range p {
			added[i][k] = v
		}
	}
	if top["added_tokens"], err = json.Marshal(added); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestGoldenVariants(t *testing.T) {
	texts := corpus(t)
	raw, err := os.ReadFile(filepath.Join(tokensDir, "variants.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vf variantsFile
	if err := json.Unmarshal(raw, &vf); err != nil {
		t.Fatal(err)
	}
	if len(vf.Variants) == 0 {
		t.Fatal("no variants")
	}
	for _, v := range vf.Variants {
		t.Run(v.Name, func(t *testing.T) {
			tk, err := FromJSON(buildVariant(t, v.Base, v.Replace, v.AddedTokens))
			if err != nil {
				t.Fatal(err)
			}
			golden := readJSONL[struct {
				I int `json:"i"`
				goldenLine
			}](t, filepath.Join(tokensDir, "variant-"+v.Name+".jsonl.gz"))
			fails := 0
			fail := func(format string, args ...any) {
				if fails++; fails <= 8 {
					t.Errorf(format, args...)
				}
			}
			for k := 0; k < len(golden); k += stride() {
				g := golden[k]
				text := texts[g.I].Text
				ids, err := tk.Encode(text, false)
				if err != nil || !slices.Equal(ids, g.IDs) {
					fail("text %d %q:\n got %v (err %v)\nwant %v", g.I, clipS(text), clip(ids), err, clip(g.IDs))
					continue
				}
				want := text
				if g.Dec != nil {
					want = *g.Dec
				}
				if dec, err := tk.Decode(ids, false); err != nil || dec != want {
					fail("decode %d: got %q (err %v), want %q", g.I, clipS(dec), err, clipS(want))
				}
				idsS, err := tk.Encode(text, true)
				if err != nil || !slices.Equal(idsS, g.IDsS) {
					fail("text %d with specials:\n got %v\nwant %v", g.I, clip(idsS), clip(g.IDsS))
					continue
				}
				if dec, err := tk.Decode(idsS, true); err != nil || g.DecSkip == nil || dec != *g.DecSkip {
					fail("decode skip-special %d: got %q (err %v) want %q", g.I, clipS(dec), err, clipS(*g.DecSkip))
				}
			}
			if fails > 0 {
				t.Fatalf("%d of %d texts differ from HF tokenizers", fails, len(golden))
			}
		})
	}
}
