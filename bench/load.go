package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// LoadOptions tune trace loading.
type LoadOptions struct {
	Format    Format // "" = detect from the content
	BlockSize int    // tokens per hash_id block; 0 = the format's default (mooncake 512, weka from file)
}

// Load reads a trace file (or, for weka, a directory of trace files) in the given or detected format.
func Load(path string, opts LoadOptions) (*Trace, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	if st.IsDir() {
		return loadDir(path, opts)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	format := opts.Format
	br := bufio.NewReaderSize(f, 1<<16)
	if format == "" {
		if format, err = detect(path, br); err != nil {
			return nil, err
		}
	}
	switch format {
	case FormatMooncake:
		return loadMooncake(path, br, opts.BlockSize)
	case FormatWeka:
		tr, err := loadWeka(path, br)
		if err == nil && opts.BlockSize > 0 && opts.BlockSize != tr.BlockSize {
			return nil, fmt.Errorf("%s: --block-size %d contradicts the trace's block_size %d", path, opts.BlockSize, tr.BlockSize)
		}
		return tr, err
	case FormatMultiTurn:
		return loadMultiTurn(path, br)
	case FormatSingleTurn:
		return loadSingleTurn(path, br)
	}
	return nil, fmt.Errorf("unknown trace format %q", format)
}

// loadDir loads every *.json / *.jsonl file of a directory (aiperf's weka_trace directory input)
// and concatenates the traces; all files must share one format and block size.
func loadDir(dir string, opts LoadOptions) (*Trace, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read trace dir: %w", err)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".json") || strings.HasSuffix(e.Name(), ".jsonl")) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: no .json or .jsonl trace files", dir)
	}
	var all *Trace
	for _, n := range names {
		tr, err := Load(filepath.Join(dir, n), opts)
		if err != nil {
			return nil, err
		}
		if all == nil {
			all = tr
			all.Source = dir
			continue
		}
		if tr.Format != all.Format || tr.BlockSize != all.BlockSize {
			return nil, fmt.Errorf("%s: format %s/block %d differs from %s/block %d of earlier files",
				n, tr.Format, tr.BlockSize, all.Format, all.BlockSize)
		}
		all.Sessions = append(all.Sessions, tr.Sessions...)
	}
	return all, nil
}

// detect guesses the format from the keys of the first JSON value in the file.
func detect(path string, br *bufio.Reader) (Format, error) {
	head, err := br.Peek(1 << 16)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	// The first value may be longer than the peek window (weka files are one big object): read
	// just its top-level keys with a token decoder.
	keys, err := topLevelKeys(head)
	if err != nil {
		return "", fmt.Errorf("%s: cannot detect format: %w", path, err)
	}
	switch {
	case keys["requests"]:
		return FormatWeka, nil
	case keys["turns"]:
		return FormatMultiTurn, nil
	case keys["input_length"] || keys["hash_ids"] || keys["text_input"] || keys["messages"] || keys["payload"]:
		return FormatMooncake, nil
	case keys["text"] || keys["texts"]:
		return FormatSingleTurn, nil
	}
	return "", fmt.Errorf("%s: cannot detect format from keys %v; pass --format", path, sortedKeys(keys))
}

// topLevelKeys returns the keys of the first JSON object in data, tolerating truncation after them.
func topLevelKeys(data []byte) (map[string]bool, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("first value is not a JSON object")
	}
	keys := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			break // truncated by the peek window: the keys seen so far decide
		}
		k, _ := tok.(string)
		keys[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			break
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("empty first object")
	}
	return keys, nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// forEachLine calls fn with every non-blank line (1-based numbering); lines may be long.
func forEachLine(r io.Reader, fn func(line int, raw []byte) error) error {
	br := bufio.NewReaderSize(r, 1<<16)
	for line := 1; ; line++ {
		raw, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(raw)) > 0 {
			if ferr := fn(line, raw); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read line %d: %w", line, err)
		}
	}
}
