// Command go_client times sequential Dispatch calls against a dispatcher server from Go.
//
// It shows that a Go program can call the service with nothing but the generated stubs of
// proto/dispatcher/v1 and a bearer token in the `authorization` metadata, and it measures what a
// call costs when the client is not Python. It creates a session (or uses -session), makes -warmup
// unmeasured calls, then -n calls, each a Dispatch with one tool_use whose stream is read to its
// end, closes the session it created, and prints {"session_id": ..., "samples_ms": [...]} on stdout. A result with is_error, or a stream without
// exactly one result, ends the run with a non-zero exit. With -processes it checks the background
// process RPCs instead: ListProcesses of the session, and NOT_FOUND for an unknown process and an
// unknown session; it prints what it saw as {"processes": ...} (see processReport).
//
// With -tools openai|anthropic|mcp it instead prints the session's tools in that provider's shape,
// ListTools' definitions_json: a JSON array a Go agent passes as that API's `tools` unchanged.
//
// The stubs are generated at build time (scripts/build_go_client.sh), into the package below.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "dispatcher/bench/go_client/dispatcherv1"
)

type report struct {
	SessionID string    `json:"session_id"`
	Tool      string    `json:"tool"`
	SamplesMs []float64 `json:"samples_ms"`
}

func main() {
	target := flag.String("target", "127.0.0.1:50051", "host:port of the server (plaintext)")
	token := flag.String("token", "", "bearer token (default: $DISPATCHER_TOKEN)")
	workspace := flag.String("workspace", "", "workspace of the new session (\"\": the server's default)")
	session := flag.String("session", "", "call in this existing session instead of creating one (and closing it)")
	tool := flag.String("tool", "shell", "tool to call")
	input := flag.String("input", `{"command": "true"}`, "tool input as a JSON object")
	n := flag.Int("n", 100, "measured calls")
	warmup := flag.Int("warmup", 5, "unmeasured calls first")
	timeout := flag.Duration("timeout", 30*time.Second, "limit of each call")
	processes := flag.Bool("processes", false, "check the background process RPCs instead of timing calls")
	tools := flag.String("tools", "", "print the tools in this provider's shape (openai, anthropic, mcp) and exit")
	flag.Parse()
	if *token == "" {
		*token = os.Getenv("DISPATCHER_TOKEN")
	}
	if *tools != "" {
		definitions, err := listTools(*target, *token, *session, *workspace, *tools, *timeout)
		if err != nil {
			fail(err)
		}
		fmt.Println(definitions)
		return
	}
	if !json.Valid([]byte(*input)) {
		fail(fmt.Errorf("-input is not JSON: %s", *input))
	}
	var out interface{}
	var err error
	if *processes {
		out, err = checkProcesses(*target, *token, *workspace, *timeout)
	} else {
		out, err = run(*target, *token, *session, *workspace, *tool, *input, *n, *warmup, *timeout)
	}
	if err != nil {
		fail(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "go_client:", err)
	os.Exit(1)
}

func run(target, token, sid, workspace, tool, input string, n, warmup int, timeout time.Duration) (*report, error) {
	// WithInsecure: loopback plaintext, as the bench serves; a TLS deployment passes
	// grpc.WithTransportCredentials(credentials.NewTLS(...)) instead.
	conn, err := grpc.Dial(target, grpc.WithInsecure(), grpc.WithBlock(), grpc.WithTimeout(timeout))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", target, err)
	}
	defer conn.Close()
	client := pb.NewToolDispatcherClient(conn)
	// Every call carries the token; the server answers UNAUTHENTICATED without it.
	base := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)

	if sid == "" {
		ctx, cancel := context.WithTimeout(base, timeout)
		created, err := client.CreateSession(ctx, &pb.CreateSessionRequest{
			Workspace: workspace,
			Labels:    map[string]string{"client": "go"},
		})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("CreateSession: %w", err)
		}
		sid = created.GetSession().GetSessionId()
		defer func() {
			ctx, cancel := context.WithTimeout(base, timeout)
			defer cancel()
			_, _ = client.CloseSession(ctx, &pb.CloseSessionRequest{SessionId: sid})
		}()
	}

	out := &report{SessionID: sid, Tool: tool, SamplesMs: make([]float64, 0, n)}
	for i := 0; i < warmup+n; i++ {
		started := time.Now()
		if err := dispatchOne(base, client, sid, fmt.Sprintf("tu_go_%d", i), tool, input, timeout); err != nil {
			return nil, fmt.Errorf("call %d: %w", i, err)
		}
		if i >= warmup {
			out.SamplesMs = append(out.SamplesMs, float64(time.Since(started).Nanoseconds())/1e6)
		}
	}
	return out, nil
}

// listTools returns ListTools' definitions_json for the format named (e.g. "anthropic" is
// TOOL_FORMAT_ANTHROPIC), in session sid or, when sid is "", in a session it creates and closes.
func listTools(target, token, sid, workspace, format string, timeout time.Duration) (string, error) {
	value, ok := pb.ToolFormat_value["TOOL_FORMAT_"+strings.ToUpper(format)]
	if !ok || value == 0 {
		return "", fmt.Errorf("-tools %q: expected openai, anthropic or mcp", format)
	}
	conn, err := grpc.Dial(target, grpc.WithInsecure(), grpc.WithBlock(), grpc.WithTimeout(timeout))
	if err != nil {
		return "", fmt.Errorf("connect %s: %w", target, err)
	}
	defer conn.Close()
	client := pb.NewToolDispatcherClient(conn)
	ctx, cancel := context.WithTimeout(
		metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token), timeout)
	defer cancel()
	if sid == "" {
		created, err := client.CreateSession(ctx, &pb.CreateSessionRequest{Workspace: workspace})
		if err != nil {
			return "", fmt.Errorf("CreateSession: %w", err)
		}
		sid = created.GetSession().GetSessionId()
		defer func() { _, _ = client.CloseSession(ctx, &pb.CloseSessionRequest{SessionId: sid}) }()
	}
	resp, err := client.ListTools(ctx, &pb.ListToolsRequest{SessionId: sid, Format: pb.ToolFormat(value)})
	if err != nil {
		return "", fmt.Errorf("ListTools: %w", err)
	}
	return resp.GetDefinitionsJson(), nil
}

// dispatchOne makes one Dispatch with one tool_use and reads its stream to the end: events first,
// then exactly one result.
func dispatchOne(
	base context.Context, client pb.ToolDispatcherClient, sid, id, tool, input string, timeout time.Duration,
) error {
	ctx, cancel := context.WithTimeout(base, timeout)
	defer cancel()
	stream, err := client.Dispatch(ctx, &pb.DispatchRequest{
		SessionId: sid,
		ToolUses:  []*pb.ToolUse{{Id: id, Name: tool, InputJson: input}},
	})
	if err != nil {
		return fmt.Errorf("Dispatch: %w", err)
	}
	var result *pb.ToolResult
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("Dispatch stream: %w", err)
		}
		if r := resp.GetResult(); r != nil {
			if result != nil {
				return errors.New("two results for one tool_use")
			}
			result = r
		}
	}
	if result == nil {
		return errors.New("the Dispatch stream ended without a result")
	}
	if result.GetIsError() {
		text := ""
		for _, block := range result.GetContent() {
			text += block.GetText().GetText()
		}
		return fmt.Errorf("%s failed: %s (%s): %s", tool, result.GetErrorClass(), result.GetReason(), text)
	}
	if result.GetToolUseId() != id {
		return fmt.Errorf("result for %q, expected %q", result.GetToolUseId(), id)
	}
	return nil
}

// processReport is what -processes saw. Processes is the number ListProcesses listed in a new
// session (none started there), or -1 when its backend has no process table (FAILED_PRECONDITION,
// Unsupported says why); UnknownProcess and UnknownSession are the status codes of a
// SignalProcess naming no process and a ListProcesses naming no session.
type processReport struct {
	SessionID      string `json:"session_id"`
	Processes      int    `json:"processes"`
	Unsupported    string `json:"unsupported,omitempty"`
	UnknownProcess string `json:"unknown_process"`
	UnknownSession string `json:"unknown_session"`
}

func checkProcesses(target, token, workspace string, timeout time.Duration) (*processReport, error) {
	conn, err := grpc.Dial(target, grpc.WithInsecure(), grpc.WithBlock(), grpc.WithTimeout(timeout))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", target, err)
	}
	defer conn.Close()
	client := pb.NewToolDispatcherClient(conn)
	ctx, cancel := context.WithTimeout(
		metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token), timeout)
	defer cancel()
	created, err := client.CreateSession(ctx, &pb.CreateSessionRequest{Workspace: workspace})
	if err != nil {
		return nil, fmt.Errorf("CreateSession: %w", err)
	}
	sid := created.GetSession().GetSessionId()
	defer func() { _, _ = client.CloseSession(ctx, &pb.CloseSessionRequest{SessionId: sid}) }()

	out := &processReport{SessionID: sid}
	listed, err := client.ListProcesses(ctx, &pb.ListProcessesRequest{SessionId: sid})
	switch {
	case err == nil:
		out.Processes = len(listed.GetProcesses())
	case status.Code(err) == codes.FailedPrecondition:
		out.Processes, out.Unsupported = -1, status.Convert(err).Message()
	default:
		return nil, fmt.Errorf("ListProcesses: %w", err)
	}
	_, err = client.SignalProcess(ctx, &pb.SignalProcessRequest{
		SessionId: sid, ProcessId: "p_not_started", Signal: pb.ProcessSignal_PROCESS_SIGNAL_TERM,
	})
	out.UnknownProcess = status.Code(err).String()
	_, err = client.ListProcesses(ctx, &pb.ListProcessesRequest{SessionId: "ses_not_a_session"})
	out.UnknownSession = status.Code(err).String()
	return out, nil
}
