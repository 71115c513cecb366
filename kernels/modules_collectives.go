package kernels

// The collectives (package collectives): LL-packet allreduce, allgather and
// reduce-scatter (coll_ll.cu), the bandwidth algorithms through the scratch
// or zero-copy on registered buffers (coll_bulk.cu), and generated test data
// with its on-device check (coll_util.cu). The device ABI is coll_common.cuh
// (Go mirror: collectives/abi); the Go twins are in
// kernels/twins/collectives.go.
func init() {
	registry = append(registry,
		Module{
			Name: "coll_ll",
			File: "coll_ll.cu",
			Kernels: []string{
				"goep_coll_ar_ll1",
				"goep_coll_ar_ll2",
				"goep_coll_ag_ll",
				"goep_coll_rs_ll",
			},
		},
		Module{
			Name: "coll_bulk",
			File: "coll_bulk.cu",
			Kernels: []string{
				"goep_coll_ar_rsag",
				"goep_coll_ag_scratch",
				"goep_coll_rs_scratch",
				"goep_coll_ar_zc",
				"goep_coll_ag_zc",
				"goep_coll_rs_zc",
			},
		},
		Module{
			Name: "coll_util",
			File: "coll_util.cu",
			Kernels: []string{
				"goep_coll_fill",
				"goep_coll_check",
			},
		})
}
