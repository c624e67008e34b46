package keylimits

import (
	"math"
	"time"
)

// demandTau is the time constant of a bucket's demand rate (an exponentially decayed count of
// attempted cost): long enough that a steady stream reads steadily, short enough that a
// key's traffic moving to another replica moves its share within a second or two.
const demandTau = time.Second

// floorShare is the demand every live replica is credited with, as a fraction of the key's
// rate: an idle fleet splits a bucket evenly, and no replica's share is ever zero.
const floorShare = 0.05

// partTau smooths the share that sizes a replica's part of the burst: a share that dips for
// one report interval (a peer's first demand report heard before this replica's own) barely
// moves it, a lasting change (traffic moved) does within a second.
const partTau = 250 * time.Millisecond

// bucket is one token bucket, this replica's part of the fleet's. The fleet's bucket (what a
// single gateway would hold) refills at rate and holds capacity; a replica with share s of the
// key's demand receives s of every refill, holds at most part (s smoothed over partTau) of the
// capacity, and pays an admission's plain cost. The share weighs the refill, not the price, so
// the replicas together receive the rate while their shares sum to 1, however the shares move
// between admissions (see Limiter).
type bucket struct {
	perMinute int
	rate      float64 // the fleet's refill, per second
	capacity  float64 // the fleet's size
	level     float64 // this replica's part, in cost units
	share     float64 // this replica's share since at (1 alone)
	part      float64 // share smoothed over partTau: the part of the capacity held
	peerSet   uint64  // the Limiter's peer-set count part follows
	at        time.Time
	demand    float64 // attempted cost per second on this replica, decayed with demandTau
	demandAt  time.Time
}

// newBucket is a full bucket of perMinute refilled continuously, holding capacity, at share 1.
func newBucket(perMinute int, capacity float64, now time.Time) *bucket {
	return &bucket{perMinute: perMinute, rate: float64(perMinute) / 60, capacity: capacity, level: capacity,
		share: 1, part: 1, at: now, demandAt: now}
}

// advance refills the bucket up to now at share (this replica's share since the last
// advance: the Limiter advances every bucket whose share is about to change) and moves part
// toward it: at once when the set of live peers changed (peerSet), else over partTau. What the
// replica holds follows its part (its fleet-wide fill stays), so a busy replica whose part
// grows as its peers' shrink takes over some of their unused burst; debt is not scaled (a
// replica in debt at a momentarily low part would else owe more when its part recovers). A
// level above the part's capacity is dropped: the fleet's bucket holds capacity in all.
func (b *bucket) advance(now time.Time, share float64, peerSet uint64) {
	dt := 0.0
	if now.After(b.at) {
		dt = now.Sub(b.at).Seconds()
		b.at = now
	}
	prev := b.part
	if peerSet != b.peerSet {
		b.part, b.peerSet = share, peerSet
	} else {
		b.part += (share - b.part) * (1 - math.Exp(-dt/partTau.Seconds()))
	}
	if b.level > 0 && b.part != prev {
		b.level *= b.part / prev
	}
	b.level = min(b.level+b.rate*share*dt, b.capacity*b.part)
	b.share = share
}

// decayedDemand is the demand rate at now (without changing the bucket).
func (b *bucket) decayedDemand(now time.Time) float64 {
	if !now.After(b.demandAt) {
		return b.demand
	}
	return b.demand * math.Exp(-now.Sub(b.demandAt).Seconds()/demandTau.Seconds())
}

// attempt records cost as demand at now.
func (b *bucket) attempt(cost float64, now time.Time) {
	b.demand = b.decayedDemand(now) + cost/demandTau.Seconds()
	if now.After(b.demandAt) {
		b.demandAt = now
	}
}

// need is the level an admission of cost waits for: its cost, or this replica's full part when
// the cost exceeds it (a request larger than the bucket is admitted from a full bucket and
// leaves it in debt, so it is never refused forever and the rate still holds).
func (b *bucket) need(cost float64) float64 {
	return min(cost, b.capacity*b.part)
}

// take charges an admission of cost.
func (b *bucket) take(cost float64) { b.level -= cost }

// refund gives back units (negative: charges more), never above this replica's full part.
func (b *bucket) refund(units float64) {
	b.level = min(b.capacity*b.part, b.level+units)
}

// wait is how long until the level reaches need at the current share (0 when it has).
func (b *bucket) wait(need float64) time.Duration {
	if b.level >= need || b.rate <= 0 {
		return 0
	}
	return time.Duration((need - b.level) / (b.rate * b.share) * float64(time.Second))
}

// status is the bucket as OpenAI's x-ratelimit headers show it, fleet-wide: the per-minute
// limit, what may be spent now (this replica's level over its part, in whole units; the
// epsilon absorbs the division's rounding, so a full part of 1/3 reads as the whole burst) and
// the time until the bucket is full again.
func (b *bucket) status() BucketStatus {
	return BucketStatus{Limit: b.perMinute, Remaining: int(max(0, math.Floor(b.level/b.part+1e-9))), Reset: b.wait(b.capacity * b.part)}
}
