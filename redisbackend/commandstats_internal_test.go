package redisbackend

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// CommandCalls is how many times the server behind c ran cmd (lower case)
// since its statistics were last reset, from INFO commandstats; 0 when it
// has not run it. Exported for the external tests as well.
func CommandCalls(ctx context.Context, c redis.Cmdable, cmd string) int {
	info := c.Info(ctx, "commandstats").Val()
	i := strings.Index(info, "cmdstat_"+cmd+":calls=")
	if i < 0 {
		return 0
	}
	n, _ := strconv.Atoi(strings.SplitN(info[i+len("cmdstat_"+cmd+":calls="):], ",", 2)[0])
	return n
}
