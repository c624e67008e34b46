//go:build race

package tokenize

// raceEnabled: the race detector slows the 30 MiB tests about tenfold; they skip under it.
const raceEnabled = true
