package engine

import "strings"

func indexFrom(s, sub string, from int) int {
	k := strings.Index(s[from:], sub)
	if k < 0 {
		return -1
	}
	return from + k
}
