package collectives

// UseHostNCCLForTests lets host-backend communicators use the loaded NCCL,
// which in tests is the host-memory stand-in (internal/fakenccl).
func UseHostNCCLForTests() { hostNCCL = true }
