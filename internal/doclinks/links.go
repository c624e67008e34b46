package doclinks

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// linkRE matches an inline Markdown link or image target: ](target) or ](target "title").
var linkRE = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// schemeRE matches a link with a scheme (https:, mailto:), which is not checked.
var schemeRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// headingRE matches an ATX heading.
var headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)

// Problem is one broken link.
type Problem struct {
	File string // the Markdown file, relative to the root
	Line int
	Link string
	Why  string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", p.File, p.Line, p.Link, p.Why)
}

// Check reads each Markdown file (paths relative to root) and returns every relative link
// whose file does not exist under root, and every anchor that names no heading of its file.
// Links with a scheme (https:, mailto:) are not checked; nor are links inside code blocks.
func Check(root string, files []string) ([]Problem, error) {
	anchors := map[string]map[string]bool{} // cleaned path -> slugs
	headingsOf := func(rel string) (map[string]bool, error) {
		if a, ok := anchors[rel]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return nil, err
		}
		a := Anchors(string(b))
		anchors[rel] = a
		return a, nil
	}
	var out []Problem
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		for i, line := range proseLines(string(b)) {
			if line == "" {
				continue
			}
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				if p, bad := checkLink(root, f, m[1], headingsOf); bad {
					p.Line = i + 1
					out = append(out, p)
				}
			}
		}
	}
	return out, nil
}

func checkLink(root, from, link string, headingsOf func(string) (map[string]bool, error)) (Problem, bool) {
	p := Problem{File: from, Link: link}
	if schemeRE.MatchString(link) {
		return p, false
	}
	target, anchor, _ := strings.Cut(link, "#")
	rel := from
	if target != "" {
		rel = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(from), target)))
		if strings.HasPrefix(rel, "../") {
			p.Why = "points outside the repository"
			return p, true
		}
		fi, err := os.Stat(filepath.Join(root, rel))
		if err != nil {
			p.Why = "no such file"
			return p, true
		}
		if fi.IsDir() || anchor == "" || !strings.HasSuffix(rel, ".md") {
			return p, false
		}
	}
	if anchor == "" {
		return p, false
	}
	a, err := headingsOf(rel)
	if err != nil {
		p.Why = err.Error()
		return p, true
	}
	if !a[anchor] {
		p.Why = fmt.Sprintf("no heading with anchor #%s in %s", anchor, rel)
		return p, true
	}
	return p, false
}

// proseLines returns the file's lines with those inside fenced code blocks blanked, so that
// line numbers stay those of the file.
func proseLines(s string) []string {
	lines := strings.Split(s, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return lines
}

// Anchors returns the anchors GitHub gives the headings of a Markdown text: lower-cased, every
// character other than a letter, digit, space, '-' or '_' dropped, spaces turned into '-', and a
// repeated anchor suffixed -1, -2, ...
func Anchors(s string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(s) {
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		a := Slug(m[1])
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// Slug is GitHub's anchor of one heading's text.
func Slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
