package internode

// SetNotifyTestHook installs the notify twin's hook between waits and
// reads (nil removes it); stages are NotifyStageNet and NotifyStageNVL.
func SetNotifyTestHook(h func(rank int, round uint64, stage int)) { notifyTestHook = h }

const (
	NotifyStageNet = stageNotifyNet
	NotifyStageNVL = stageNotifyNVL
)
