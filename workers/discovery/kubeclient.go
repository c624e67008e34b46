package discovery

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// The subset of discovery.k8s.io/v1 the source reads (k8s.io/api/discovery/v1 types.go).
type endpointSlice struct {
	Metadata struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	AddressType string        `json:"addressType"`
	Endpoints   []sliceMember `json:"endpoints"`
	Ports       []slicePort   `json:"ports"`
}

type sliceMember struct {
	Addresses  []string `json:"addresses"`
	Conditions struct {
		// Ready nil means unknown, which consumers treat as ready (the API's own rule).
		Ready       *bool `json:"ready"`
		Terminating *bool `json:"terminating"`
	} `json:"conditions"`
}

type slicePort struct {
	Name *string `json:"name"`
	Port *int32  `json:"port"`
}

type sliceList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []endpointSlice `json:"items"`
}

// watchEvent is one line of a watch stream (k8s.io/apimachinery/pkg/apis/meta/v1 WatchEvent).
type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// apiStatus is a metav1.Status: an error answer, or the object of an ERROR watch event.
type apiStatus struct {
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// apiError is a non-200 answer of the API.
type apiError struct {
	Code    int
	Message string
}

func (e *apiError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("status %d", e.Code)
	}
	return fmt.Sprintf("status %d: %s", e.Code, e.Message)
}

// errGone is a 410: the resourceVersion is too old to watch from; list again.
var errGone = errors.New("resource version too old (410 Gone)")

// errSevered is a watch stream that ended without its closing chunk.
var errSevered = errors.New("watch stream severed")

// kubeClient lists and watches the EndpointSlices of one Service.
type kubeClient struct {
	base      string // API URL without trailing slash
	namespace string
	selector  string
	tokenFile string
	http      *http.Client
	// watchTimeout asks the server to end each watch after it (timeoutSeconds), so that a
	// watch the network silently dropped is noticed; the client gives it a minute more.
	watchTimeout time.Duration
}

func newKubeClient(apiURL, namespace, service, tokenFile, caFile string) (*kubeClient, error) {
	u, err := url.Parse(apiURL)
	if err != nil {
		return nil, fmt.Errorf("api_url %q: %w", apiURL, err)
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}
	if u.Scheme == "https" && caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s: no PEM certificate in it", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &kubeClient{
		base:         strings.TrimRight(apiURL, "/"),
		namespace:    namespace,
		selector:     "kubernetes.io/service-name=" + service,
		tokenFile:    tokenFile,
		http:         &http.Client{Transport: tr},
		watchTimeout: 5 * time.Minute,
	}, nil
}

func (c *kubeClient) path() string {
	return c.base + "/apis/discovery.k8s.io/v1/namespaces/" + url.PathEscape(c.namespace) + "/endpointslices"
}

// tokenError is a token file that cannot be read.
type tokenError struct{ err error }

func (e *tokenError) Error() string { return "token_file: " + e.err.Error() }
func (e *tokenError) Unwrap() error { return e.err }

func (c *kubeClient) get(ctx context.Context, q url.Values) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.path()+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if c.tokenFile != "" {
		// Re-read every time: projected service-account tokens rotate (about hourly).
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, &tokenError{err}
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(b)))
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		var st apiStatus
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(body, &st) != nil || st.Message == "" {
			st.Message = strings.TrimSpace(string(body))
		}
		if resp.StatusCode == http.StatusGone {
			return nil, fmt.Errorf("%w: %s", errGone, st.Message)
		}
		return nil, &apiError{Code: resp.StatusCode, Message: st.Message}
	}
	return resp, nil
}

// list returns every slice of the Service and the list's resourceVersion, following
// continue tokens (pages of 500).
func (c *kubeClient) list(ctx context.Context) ([]endpointSlice, string, error) {
	var all []endpointSlice
	cont := ""
	for {
		q := url.Values{"labelSelector": {c.selector}, "limit": {"500"}}
		if cont != "" {
			q.Set("continue", cont)
		}
		resp, err := c.get(ctx, q)
		if err != nil {
			return nil, "", err
		}
		var l sliceList
		err = json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&l)
		resp.Body.Close()
		if err != nil {
			return nil, "", fmt.Errorf("decode list: %w", err)
		}
		all = append(all, l.Items...)
		if l.Metadata.Continue == "" {
			return all, l.Metadata.ResourceVersion, nil
		}
		cont = l.Metadata.Continue
	}
}

// watch streams the changes after rv to fn until the server ends the watch (nil), the
// stream breaks (errSevered or a read error), an ERROR event arrives (errGone for 410, else
// *apiError) or fn fails.
func (c *kubeClient) watch(ctx context.Context, rv string, fn func(typ string, obj json.RawMessage) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.watchTimeout+time.Minute)
	defer cancel()
	q := url.Values{"labelSelector": {c.selector}, "watch": {"1"}, "resourceVersion": {rv},
		"allowWatchBookmarks": {"true"}, "timeoutSeconds": {fmt.Sprint(int(c.watchTimeout.Seconds()))}}
	resp, err := c.get(ctx, q)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev watchEvent
		if err := dec.Decode(&ev); err != nil {
			switch {
			case errors.Is(err, io.EOF):
				return nil // the server ended the watch (timeoutSeconds): watch again from rv
			case errors.Is(err, io.ErrUnexpectedEOF) || ctx.Err() == nil:
				return fmt.Errorf("%w: %v", errSevered, err)
			}
			return err
		}
		if ev.Type == "ERROR" {
			var st apiStatus
			_ = json.Unmarshal(ev.Object, &st)
			if st.Code == http.StatusGone {
				return fmt.Errorf("%w: %s", errGone, st.Message)
			}
			return &apiError{Code: st.Code, Message: "watch ERROR event: " + st.Message}
		}
		if err := fn(ev.Type, ev.Object); err != nil {
			return err
		}
	}
}
