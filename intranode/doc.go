// Package intranode is the intranode EP protocol: the notify, dispatch and
// combine kernels' launches and workspace layout between the GPUs of one
// node over NVLink (or ranks sharing a GPU).
package intranode
