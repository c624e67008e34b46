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

// bucket is one token bucket, kept in fleet units: level and capacity are the whole fleet's
// (what a single gateway would hold), refilled at the whole rate. A replica with share s of
// the key's demand pays cost/s for an admission, so it spends at the rate s of the bucket
// refills, and the replicas together spend at most the rate (see Limiter).
type bucket struct {
	perMinute int
	rate      float64 // per second
	capacity  float64
	level     float64
	at        time.Time
	demand    float64 // attempted cost per second on this replica, decayed with demandTau
	demandAt  time.Time
}

// newBucket is a full bucket of perMinute refilled continuously, holding capacity.
func newBucket(perMinute int, capacity float64, now time.Time) *bucket {
	return &bucket{perMinute: perMinute, rate: float64(perMinute) / 60, capacity: capacity, level: capacity, at: now, demandAt: now}
}

// advance refills the bucket up to now.
func (b *bucket) advance(now time.Time) {
	if now.After(b.at) {
		b.level = min(b.capacity, b.level+b.rate*now.Sub(b.at).Seconds())
		b.at = now
	}
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

// need is the level an admission of cost at share s waits for: its price, or a full bucket
// when the price exceeds the bucket (a request larger than the burst is admitted from a full
// bucket and leaves it in debt, so it is never refused forever and the rate still holds).
func (b *bucket) need(cost, share float64) float64 {
	return min(cost/share, b.capacity)
}

// take charges an admission of cost at share s. The price cost/s is what keeps the fleet
// within the rate; a replica with a tiny share (its peers took nearly all the demand) would go
// into a debt of many seconds for one request, so the debt beyond the plain cost stops at one
// full bucket. It returns the fleet units charged per unit of cost (for corrections).
func (b *bucket) take(cost, share float64) float64 {
	if cost <= 0 {
		return 1 / share
	}
	after := max(b.level-cost/share, min(b.level-cost, -b.capacity))
	per := (b.level - after) / cost
	b.level = after
	return per
}

// refund gives back units (negative: charges more), never above a full bucket.
func (b *bucket) refund(units float64) {
	b.level = min(b.capacity, b.level+units)
}

// wait is how long until the level reaches need (0 when it has).
func (b *bucket) wait(need float64) time.Duration {
	if b.level >= need || b.rate <= 0 {
		return 0
	}
	return time.Duration((need - b.level) / b.rate * float64(time.Second))
}

// status is the bucket as OpenAI's x-ratelimit headers show it: the per-minute limit, what
// may be spent now (whole units) and the time until the bucket is full again.
func (b *bucket) status() BucketStatus {
	return BucketStatus{Limit: b.perMinute, Remaining: int(max(0, math.Floor(b.level))), Reset: b.wait(b.capacity)}
}
