// Package discovery finds the fleet's workers at runtime and keeps the workers.Registry in
// step: the EndpointSlices of a Kubernetes Service (a small list/watch client of the
// discovery.k8s.io/v1 API), or the A/AAAA records of a DNS name. Each source turns what it
// sees into a desired set of workers, and one reconciler adds, drains and removes registry
// members to match it; the registry tells the rest of the gateway (subscriptions, index, load,
// sessions, metrics) through its membership notifications.
package discovery
