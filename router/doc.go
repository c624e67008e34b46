// Package router picks the worker and DP rank for each request: selection policies behind
// the Policy interface, load accounting, and the routing decision record.
package router
