package indexers

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrEphemeralPort reports an endpoint whose port the worker only learns when it binds (libzmq's
// "*" or port 0): the gateway cannot connect to it.
var ErrEphemeralPort = errors.New("endpoint port is chosen at bind time")

// OffsetEndpoint applies vLLM's data-parallel endpoint offset, offset_endpoint_port
// (vllm/distributed/kv_events.py):
// rank 0 is unchanged, whatever the form; for rank r > 0, tcp://host:P → tcp://host:(P+r),
// port 0 stays 0 (each rank binds its own OS-assigned port, vLLM #55844), inproc://x →
// inproc://x_dp{r}, anything else is an error.
//
// libzmq's wildcard port "tcp://host:*" means the same as port 0 and is treated the same: left
// unchanged on every rank. vLLM itself takes it unchanged on rank 0 only; on rank r > 0 its
// int() parse of the port fails and the engine does not start. Accepting it here costs nothing
// for inputs vLLM accepts, and it is the only way to have a DP>1 publisher bind a loopback
// ephemeral port (vLLM binds only endpoints containing "*" or "::"), which the simulator's
// tests need.
func OffsetEndpoint(ep string, rank int) (string, error) {
	if rank == 0 || ep == "" {
		return ep, nil
	}
	switch {
	case strings.HasPrefix(ep, "inproc://"):
		return fmt.Sprintf("%s_dp%d", ep, rank), nil
	case strings.HasPrefix(ep, "tcp://"):
		i := strings.LastIndexByte(ep, ':')
		if i < len("tcp://") {
			return "", fmt.Errorf("invalid endpoint %q: no port", ep)
		}
		if ep[i+1:] == "*" {
			return ep, nil
		}
		port, err := strconv.Atoi(ep[i+1:])
		if err != nil || port < 0 || port > 65535 {
			return "", fmt.Errorf("invalid endpoint %q: bad port", ep)
		}
		if port == 0 {
			return ep, nil
		}
		if port+rank > 65535 {
			return "", fmt.Errorf("invalid endpoint %q: port %d+%d for data-parallel rank %d exceeds 65535", ep, port, rank, rank)
		}
		return ep[:i+1] + strconv.Itoa(port+rank), nil
	}
	return "", fmt.Errorf("invalid endpoint %q: must contain 'inproc' or 'tcp'", ep)
}

// ephemeralPort reports a tcp endpoint whose port is "*" or 0.
func ephemeralPort(ep string) bool {
	if !strings.HasPrefix(ep, "tcp://") {
		return false
	}
	p := ep[strings.LastIndexByte(ep, ':')+1:]
	return p == "*" || p == "0"
}

// shouldBind is vLLM's publisher heuristic (ZmqEventPublisher binds an endpoint that
// contains "*" and connects otherwise) seen from the other side: an endpoint
// the worker would connect to ("tcp://collector:5557") is one the gateway must bind. Callers
// normally set SubscriberConfig.Bind explicitly; this helps map a worker's kv-events-config.
func shouldBind(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// ConnectEndpoint turns a worker-side bind address such as "tcp://*:5557" into the address the
// gateway connects to, given the worker's host.
func ConnectEndpoint(workerEndpoint, host string) string {
	if !shouldBind(workerEndpoint) || !strings.HasPrefix(workerEndpoint, "tcp://") {
		return workerEndpoint
	}
	rest := strings.TrimPrefix(workerEndpoint, "tcp://")
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return workerEndpoint
	}
	return "tcp://" + host + rest[i:]
}
