package sovereign

import "fmt"

// State is an elector's role in its election.
type State int

const (
	// Follower: another instance leads, or the elector is not campaigning
	// (before Start and after Close).
	Follower State = iota
	// Candidate: no leader is known and the elector is trying to acquire the
	// lease, or it has acquired it and is verifying it.
	Candidate
	// Leader: the elector holds a verified lease and its renew deadline has not
	// passed.
	Leader
)

// String returns "follower", "candidate" or "leader".
func (s State) String() string {
	switch s {
	case Follower:
		return "follower"
	case Candidate:
		return "candidate"
	case Leader:
		return "leader"
	default:
		return fmt.Sprintf("State(%d)", int(s))
	}
}
