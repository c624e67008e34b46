// Package deploy holds the offline tests of kvgate's deployment artefacts: the Helm chart
// (deploy/helm/kvgate) rendered with the Helm Go library and decoded strictly into the
// Kubernetes API types, and the Grafana dashboard (deploy/grafana). It is a module of its own so
// that Helm and the Kubernetes modules stay out of the product's go.mod.
package deploy
