// The Go bench client (main.go). Offline, scripts/build_go_client.sh builds it in GOPATH mode
// against Debian's golang-google-grpc-dev / golang-google-protobuf-dev and ignores this file.
// With a module proxy: generate the stubs into ./dispatcherv1 (see the script's protoc line),
// then `go mod tidy && go build`.
module dispatcher/bench/go_client

go 1.19

require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
