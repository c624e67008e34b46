package tokenize

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// HubOptions controls downloading a model's tokenizer files from the Hugging Face hub.
// Zero values take the environment variables the HF libraries honour.
type HubOptions struct {
	// Endpoint is the hub base URL. Default: $HF_ENDPOINT, else https://huggingface.co.
	Endpoint string
	// Token authenticates gated or private repos. Default: $HF_TOKEN, else
	// $HUGGING_FACE_HUB_TOKEN.
	Token string
	// Revision is a branch, tag or commit. Default: "main".
	Revision string
	// CacheDir is the hub cache (HF layout: models--org--name/snapshots/<commit>/...). Default:
	// $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.
	CacheDir string
	// Client is the HTTP client. Default: http.DefaultClient.
	Client *http.Client
	// MaxFileBytes bounds each downloaded file. Default: 1 GiB.
	MaxFileBytes int64
}

// hubFile is one file DownloadTokenizer fetches.
type hubFile struct {
	name     string
	required bool
}

// hubFiles lists the files Load reads (config.json for the model type, e.g. gpt-oss's Harmony);
// only tokenizer.json is required (a folder without tokenizer_config.json loads with no chat
// template and no special-token names).
func hubFiles() []hubFile {
	return []hubFile{
		{"tokenizer.json", true},
		{"tokenizer_config.json", false},
		{"chat_template.jinja", false},
		{"chat_template.json", false},
		{"special_tokens_map.json", false},
		{"config.json", false},
		{"generation_config.json", false},
	}
}

var (
	repoIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$`)
	commitPattern = regexp.MustCompile(`^[0-9a-f]{40}$`)
)

// ErrHubAuth is returned when the hub refuses a download (401/403): the repo is gated or private
// and HF_TOKEN is missing or lacks access.
var ErrHubAuth = errors.New("hub refused access (gated or private repo: set HF_TOKEN)")

// DownloadTokenizer fetches the tokenizer files of repo ("org/name") at the requested revision
// into the hub cache and returns the snapshot folder, ready for Load. When the hub cannot be
// reached but an earlier download of the same revision is cached, that snapshot is returned.
func DownloadTokenizer(ctx context.Context, repo string, o HubOptions) (string, error) {
	if !repoIDPattern.MatchString(repo) || strings.Contains(repo, "..") {
		return "", fmt.Errorf("hub: %q is not a model id of the form org/name", repo)
	}
	o = o.withDefaults()
	repoDir := filepath.Join(o.CacheDir, "models--"+strings.ReplaceAll(repo, "/", "--"))
	commit, err := downloadAll(ctx, repo, repoDir, o)
	if err != nil {
		if errors.Is(err, ErrHubAuth) || ctx.Err() != nil {
			return "", err
		}
		if cached, ok := cachedSnapshot(repoDir, o.Revision); ok {
			return cached, nil
		}
		return "", err
	}
	return filepath.Join(repoDir, "snapshots", commit), nil
}

func (o HubOptions) withDefaults() HubOptions {
	if o.Endpoint == "" {
		o.Endpoint = os.Getenv("HF_ENDPOINT")
	}
	if o.Endpoint == "" {
		o.Endpoint = "https://huggingface.co"
	}
	o.Endpoint = strings.TrimRight(o.Endpoint, "/")
	if o.Token == "" {
		o.Token = os.Getenv("HF_TOKEN")
	}
	if o.Token == "" {
		o.Token = os.Getenv("HUGGING_FACE_HUB_TOKEN")
	}
	if o.Revision == "" {
		o.Revision = "main"
	}
	if o.CacheDir == "" {
		o.CacheDir = os.Getenv("HF_HUB_CACHE")
	}
	if o.CacheDir == "" {
		if home := os.Getenv("HF_HOME"); home != "" {
			o.CacheDir = filepath.Join(home, "hub")
		}
	}
	if o.CacheDir == "" {
		if home, err := os.UserHomeDir(); err == nil {
			o.CacheDir = filepath.Join(home, ".cache", "huggingface", "hub")
		}
	}
	if o.Client == nil {
		o.Client = http.DefaultClient
	}
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = 1 << 30
	}
	return o
}

// downloadAll fetches every file into snapshots/<commit>/ and records refs/<revision>.
func downloadAll(ctx context.Context, repo, repoDir string, o HubOptions) (string, error) {
	commit := ""
	for _, f := range hubFiles() {
		resp, err := hubGet(ctx, repo, f.name, o)
		if err != nil {
			return "", err
		}
		switch {
		case resp.StatusCode == http.StatusNotFound && !f.required:
			resp.Body.Close()
			continue
		case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
			resp.Body.Close()
			return "", fmt.Errorf("hub: %s/%s: HTTP %d: %w", repo, f.name, resp.StatusCode, ErrHubAuth)
		case resp.StatusCode != http.StatusOK:
			resp.Body.Close()
			return "", fmt.Errorf("hub: %s/%s: HTTP %d", repo, f.name, resp.StatusCode)
		}
		if commit == "" {
			commit = resp.Header.Get("X-Repo-Commit")
			if !commitPattern.MatchString(commit) {
				commit = safeName(o.Revision)
			}
		}
		err = saveFile(filepath.Join(repoDir, "snapshots", commit, f.name), resp.Body, o.MaxFileBytes)
		resp.Body.Close()
		if err != nil {
			return "", fmt.Errorf("hub: %s/%s: %w", repo, f.name, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(repoDir, "refs"), 0o755); err != nil {
		return "", fmt.Errorf("hub: %w", err)
	}
	if err := os.WriteFile(filepath.Join(repoDir, "refs", safeName(o.Revision)), []byte(commit), 0o644); err != nil {
		return "", fmt.Errorf("hub: %w", err)
	}
	return commit, nil
}

func hubGet(ctx context.Context, repo, file string, o HubOptions) (*http.Response, error) {
	u := o.Endpoint + "/" + repo + "/resolve/" + url.PathEscape(o.Revision) + "/" + file
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	if o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+o.Token)
	}
	req.Header.Set("User-Agent", "kvgate/tokenize")
	resp, err := o.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("hub: GET %s: %w", u, err)
	}
	return resp, nil
}

// saveFile writes r to path through a temporary file and a rename, so a reader never sees a
// partial file; more than max bytes is an error.
func saveFile(path string, r io.Reader, max int64) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".download-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, io.LimitReader(r, max+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if n > max {
		return fmt.Errorf("file larger than %d bytes", max)
	}
	return os.Rename(tmp.Name(), path)
}

// cachedSnapshot returns the snapshot refs/<revision> points to when it holds tokenizer.json.
func cachedSnapshot(repoDir, revision string) (string, bool) {
	commit := safeName(revision)
	if b, err := os.ReadFile(filepath.Join(repoDir, "refs", safeName(revision))); err == nil {
		commit = strings.TrimSpace(string(b))
	}
	dir := filepath.Join(repoDir, "snapshots", safeName(commit))
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		return "", false
	}
	return dir, true
}

// safeName makes a revision usable as one path element.
func safeName(s string) string {
	s = strings.NewReplacer("/", "--", "\\", "--", "..", "__").Replace(s)
	if s == "" || s == "." {
		return "_"
	}
	return s
}
