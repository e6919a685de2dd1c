//go:build !linux || !amd64 || race

package pool

import "errors"

// biasable: false where membarrier(2) does not exist, and under the race
// detector, which cannot see the order biased sections rely on.
const biasable = false

func registerProcessBarrier() error { return errors.ErrUnsupported }

var processBarrier = func() error { return errors.ErrUnsupported }
