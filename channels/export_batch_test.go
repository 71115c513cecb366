package channels

// HoldHostBatchesForTest makes host-backend connections claim batches in
// flight three polls in four, so the proxy gathers puts into batches;
// the returned func turns it off again.
func HoldHostBatchesForTest() func() {
	hostHoldBatches.Store(true)
	return func() { hostHoldBatches.Store(false) }
}
