// Package intranode runs the dispatch-layout, notify, dispatch and combine
// kernels between the GPUs of one node over NVLink. (Being built.)
package intranode
