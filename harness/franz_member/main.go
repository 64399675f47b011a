// Command franz_member is one franz-go consumer group member, for tests of the proxy with
// an unmodified Go client: it prints every record it gets as one line
// "partition<TAB>offset<TAB>key<TAB>value" and commits as franz-go does by default
// (autocommit of the offset after the last record polled, every -commit-ms), until its
// standard input closes; then it commits what it polled and leaves the group.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "bootstrap servers, comma separated")
	topic := flag.String("topic", "", "topic to consume")
	group := flag.String("group", "", "consumer group")
	commitMs := flag.Int("commit-ms", 500, "autocommit interval")
	flag.Parse()
	if *topic == "" || *group == "" {
		fmt.Fprintln(os.Stderr, "franz_member: -topic and -group are required")
		os.Exit(2)
	}
	client, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(*brokers, ",")...),
		kgo.ConsumerGroup(*group),
		kgo.ConsumeTopics(*topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AutoCommitInterval(time.Duration(*commitMs)*time.Millisecond),
		kgo.SessionTimeout(10*time.Second),
		kgo.HeartbeatInterval(500*time.Millisecond),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "franz_member:", err)
		os.Exit(1)
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() { // the test closes our standard input to stop us
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	out := bufio.NewWriter(os.Stdout)
	for ctx.Err() == nil {
		fetches := client.PollFetches(ctx)
		fetches.EachError(func(t string, p int32, err error) {
			if ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "franz_member: fetch error %s[%d]: %v\n", t, p, err)
			}
		})
		fetches.EachRecord(func(r *kgo.Record) {
			fmt.Fprintf(out, "%d\t%d\t%s\t%s\n", r.Partition, r.Offset, r.Key, r.Value)
		})
		out.Flush()
	}
	client.Close() // commits what was polled, then leaves the group
}
