package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/cluster"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
)

// clusterWarmStart is the indexers.WarmStarter of a replica in a cluster: the peers' snapshots
// over NATS (cluster.Snapshots). cluster does not import indexers, so its "no peer" becomes
// indexers.ErrNoSnapshot here.
type clusterWarmStart struct{ s *cluster.Snapshots }

// FetchSnapshot implements indexers.WarmStarter.
func (w clusterWarmStart) FetchSnapshot(ctx context.Context, t kvkey.Target) ([]byte, string, error) {
	data, peer, err := w.s.FetchSnapshot(ctx, t)
	if errors.Is(err, cluster.ErrNoPeer) {
		err = fmt.Errorf("%w: %w", indexers.ErrNoSnapshot, err)
	}
	return data, peer, err
}

// wireWarmStart serves mgr's exact index state to the peers and makes every subscription
// started from now on ask them for a snapshot before its first join (bounded by
// cluster.snapshot_timeout). The returned function stops serving.
func wireWarmStart(node *cluster.Node, mgr *indexers.Subscribers, prom prometheus.Registerer, log *slog.Logger) (func(), error) {
	snaps, err := cluster.NewSnapshots(node, mgr, prom, log)
	if err != nil {
		return nil, err
	}
	mgr.SetWarmStarter(clusterWarmStart{s: snaps}, node.Config().SnapshotTimeout.D())
	return snaps.Close, nil
}
