// Package internode is where internode EP (network between nodes, NVLink
// forwarding inside them) will live; it is not built yet, and the Buffer
// runs only groups of one node.
package internode
