// Package routing describes MoE routings (top-k ids), validates them, computes
// the dispatch layout in Go and on the device, and generates routings.
//
// A routing is topk_idx[T, K], row-major, as int64 (what torch.topk returns)
// or int32; -1 marks an unused slot. E experts are spread evenly over R
// ranks: rank r owns experts [r*E/R, (r+1)*E/R).
//
// The package has two parts:
//
//   - host types and validation (Shape, Routing), a routing generator that
//     matches DeepEP's tests (Generate), and a plain-Go reference layout
//     (ReferenceLayout, CountLayout) that the host backend's kernel twin and
//     every GPU check use;
//   - LaunchLayout, which validates a device-side routing's shape and
//     launches the layout kernel (kernels/layout.cu) on either backend,
//     and LaunchWidenIDs, which widens int32 ids to int64 on the device
//     (kernels/ep_convert.cu) for the kernels that read int64.
//
// Offline analysis of recorded routings (.npy files, traffic tables) lives
// in bench, its only user.
package routing
