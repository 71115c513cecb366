// Package spawn starts N local rank processes like torchrun --standalone and
// stops them all when one fails (ep-bench launch).
package spawn
