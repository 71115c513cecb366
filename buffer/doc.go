// Package buffer owns the memory an EP Buffer is made of, on each rank of a
// node: the IPC-shared NVLink workspace (laid out by intranode.NewLayout
// from the size hints of SizeHints), registered with and exchanged through
// a channels.Communicator; the peer pointer table on the GPU; handle slots;
// the dispatch-layout outputs; memory semaphores for a device barrier;
// pinned host-mapped counters; a stream and events. Every device-side wait
// is bounded by the communicator's watchdog, and a timeout makes the Buffer
// refuse calls until Close.
//
// Package ep is the API engines use; it launches the kernels on a Buffer.
package buffer
