package kvkey

import "unsafe"

// AsBlockHashes views chained hashes carried as bare uint64s (the request path:
// router.Request.BlockHashes, tokenize.BlockHashes) as BlockHashes, without copying: the result
// shares h's memory, so it must be treated as read-only wherever h is. BlockHash's underlying
// type is uint64, so both slices have the same layout. It exists so that the event index can
// take BlockHash at its API while the request path still carries []uint64; once that carries
// []BlockHash itself, this goes.
func AsBlockHashes(h []uint64) []BlockHash {
	if len(h) == 0 {
		return nil
	}
	return unsafe.Slice((*BlockHash)(unsafe.SliceData(h)), len(h))
}
