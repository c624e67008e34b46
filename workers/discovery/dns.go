package discovery

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/workers"
	"github.com/kvgate/kvgate/workers/discoveryconfig"
)

const sourceDNS = "dns"

// Resolver resolves a host name to its addresses; *net.Resolver is one.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
}

// dnsSource re-resolves a (headless) name every interval; each address is one ready worker.
// A failed resolution keeps the workers known; a name that does not exist (NXDOMAIN) is an
// empty fleet.
type dnsSource struct {
	cfg discoveryconfig.DNS
	res Resolver
	rec *reconciler
	o   Options
	syncState
}

func newDNS(cfg discoveryconfig.DNS, reg *workers.Registry, o Options) *dnsSource {
	res := o.Resolver
	if res == nil {
		res = net.DefaultResolver
	}
	return &dnsSource{cfg: cfg, res: res, o: o, rec: newReconciler(sourceDNS, reg, o.Metrics, o.Log),
		syncState: syncState{name: "discovery.dns"}}
}

// Run resolves at once, then every interval (sooner, with backoff, while it fails before the
// first success), until ctx ends.
func (d *dnsSource) Run(ctx context.Context) {
	bo := backoff{min: d.o.MinBackoff, max: min(d.o.MaxBackoff, d.cfg.Interval.D())}
	lastErr := ""
	for {
		wait := d.cfg.Interval.D()
		if err := d.resolve(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			d.o.Metrics.error(sourceDNS, "resolve")
			d.fail("cannot resolve " + d.cfg.Name + ": " + err.Error())
			if err.Error() != lastErr {
				d.o.Log.Error("dns discovery: cannot resolve; keeping the workers known", "name", d.cfg.Name, "err", err)
				lastErr = err.Error()
			}
			if !d.synced {
				wait = bo.next()
			}
		} else {
			lastErr = ""
			bo.reset()
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}

func (d *dnsSource) resolve(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, max(d.cfg.Interval.D(), 5*time.Second))
	defer cancel()
	addrs, err := d.res.LookupIPAddr(rctx, d.cfg.Name)
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		addrs, err = nil, nil
	}
	if err != nil {
		return err
	}
	d.o.Metrics.event(sourceDNS, "resolve")
	desired := make(map[string]Endpoint, len(addrs))
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		host := ip.Unmap().WithZone(a.Zone).String()
		w := configs.Worker{URL: "http://" + net.JoinHostPort(host, strconv.Itoa(d.cfg.Port)), DPSize: 1}
		if d.cfg.KVEventsPort > 0 {
			w.KVEvents = "tcp://" + net.JoinHostPort(host, strconv.Itoa(d.cfg.KVEventsPort))
			if d.cfg.ReplayPort > 0 {
				w.Replay = "tcp://" + net.JoinHostPort(host, strconv.Itoa(d.cfg.ReplayPort))
			}
		}
		desired[w.URL] = Endpoint{Worker: w, Ready: true}
	}
	d.rec.apply(desired)
	if !d.synced {
		d.o.Log.Info("dns discovery synced", "name", d.cfg.Name, "workers", len(desired))
	}
	d.markSynced()
	return nil
}
