package server

import (
	"net/http"
	"slices"

	"github.com/gin-gonic/gin"
)

// corsMaxAge is how long (seconds) a browser may cache a preflight answer.
const corsMaxAge = "600"

// cors answers preflight OPTIONS and sets Access-Control-Allow-Origin for an allowed Origin
// (cors.allowed_origins); a request from another origin gets no CORS headers (the browser then
// refuses it) and is otherwise served as usual.
func (s *Server) cors(origins []string) gin.HandlerFunc {
	anyOrigin := slices.Contains(origins, "*")
	return func(c *gin.Context) {
		origin := c.GetHeader("Origin")
		if origin == "" || !(anyOrigin || slices.Contains(origins, origin)) {
			c.Next()
			return
		}
		h := c.Writer.Header()
		h.Set("Access-Control-Allow-Origin", origin)
		h.Add("Vary", "Origin")
		h.Set("Access-Control-Expose-Headers", "*")
		if c.Request.Method == http.MethodOptions && c.GetHeader("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
			if req := c.GetHeader("Access-Control-Request-Headers"); req != "" {
				h.Set("Access-Control-Allow-Headers", req)
			}
			h.Set("Access-Control-Max-Age", corsMaxAge)
			c.AbortWithStatus(http.StatusNoContent)
			return
		}
		c.Next()
	}
}
