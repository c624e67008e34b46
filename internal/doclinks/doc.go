// Package doclinks checks the repository's Markdown: every relative link in README.md and
// docs/ points to a file that exists, and every #anchor to a heading of that file. It holds
// only the checker; its test runs it over the repository.
package doclinks
