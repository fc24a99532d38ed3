// The protocol's floor in Go: an extender that decides nothing, standard library only.
//
// The same three answers as loadtests/nullextender.py (every node passes filter, prioritize
// scores none, bind posts one Binding with a GPU-ids annotation), served by net/http and
// posted with one kept-alive client: the throughput benchmark's phase G, what the extender
// protocol costs kube-scheduler with the fastest plausible extender on the other end.
//
//	go build -o goextender . && ./goextender -port 8888 -server https://127.0.0.1:6443 \
//	    -ca-file ca.crt -token-file token
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// maxBody bounds every request body: kube-scheduler's largest ask is well below it.
const maxBody = 8 << 20

type extenderArgs struct {
	NodeNames *[]string
}

type filterResult struct {
	Nodes                      *struct{}         `json:"Nodes"`
	NodeNames                  *[]string         `json:"NodeNames"`
	FailedNodes                map[string]string `json:"FailedNodes"`
	FailedAndUnresolvableNodes map[string]string `json:"FailedAndUnresolvableNodes"`
	Error                      string            `json:"Error"`
}

type bindingArgs struct {
	PodName, PodNamespace, PodUID, Node string
}

type bindingResult struct {
	Error string `json:"Error"`
}

// shortlist: filter passes only the first K nodes, schedext's shortlist-mode call pattern
// (0: every node passes).
var shortlist int

type binder struct {
	client *http.Client
	server string
	token  string
}

func main() {
	port := flag.Int("port", 0, "port on 127.0.0.1")
	server := flag.String("server", "", "the API server's URL")
	caFile := flag.String("ca-file", "", "CA of an https API server")
	tokenFile := flag.String("token-file", "", "bearer token")
	flag.IntVar(&shortlist, "shortlist", 0, "filter passes the first K nodes (0: all)")
	flag.Parse()
	if *port == 0 || *server == "" || *tokenFile == "" {
		log.Fatal("-port, -server and -token-file are required")
	}
	if shortlist < 0 {
		log.Fatal("-shortlist must be >= 0")
	}
	token, err := os.ReadFile(*tokenFile)
	if err != nil {
		log.Fatal(err)
	}
	transport := &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			log.Fatal(err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			log.Fatalf("%s: no certificate", *caFile)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	b := &binder{
		client: &http.Client{Transport: transport, Timeout: 30 * time.Second},
		server: strings.TrimRight(*server, "/"),
		token:  strings.TrimSpace(string(token)),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", filter)
	mux.HandleFunc("POST /prioritize", prioritize)
	mux.HandleFunc("POST /bind", b.bind)
	for _, path := range []string{"/readyz", "/healthz", "/metrics"} {
		mux.HandleFunc("GET "+path, func(http.ResponseWriter, *http.Request) {})
	}
	listener, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(*port))
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.Serve(listener))
}

func filter(w http.ResponseWriter, r *http.Request) {
	var args extenderArgs
	result := filterResult{FailedNodes: map[string]string{}, FailedAndUnresolvableNodes: map[string]string{}}
	if err := decode(w, r, &args); err != nil {
		result.Error = err.Error()
	} else if args.NodeNames == nil {
		result.Error = "names only: this floor needs nodeCacheCapable: true"
	} else {
		if shortlist > 0 && len(*args.NodeNames) > shortlist {
			kept := (*args.NodeNames)[:shortlist]
			args.NodeNames = &kept
		}
		result.NodeNames = args.NodeNames
	}
	answer(w, result)
}

func prioritize(w http.ResponseWriter, r *http.Request) {
	var args extenderArgs
	if err := decode(w, r, &args); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	answer(w, []struct{}{})
}

func (b *binder) bind(w http.ResponseWriter, r *http.Request) {
	var args bindingArgs
	if err := decode(w, r, &args); err != nil {
		answer(w, bindingResult{Error: err.Error()})
		return
	}
	answer(w, bindingResult{Error: b.post(args)})
}

// post writes the Binding and returns what went wrong, or "".
func (b *binder) post(args bindingArgs) string {
	body, err := json.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "Binding",
		"metadata": map[string]any{
			"name":        args.PodName,
			"namespace":   args.PodNamespace,
			"uid":         args.PodUID,
			"annotations": map[string]string{"schedext.io/gpu-ids": "0"},
		},
		"target": map[string]string{"apiVersion": "v1", "kind": "Node", "name": args.Node},
	})
	if err != nil {
		return err.Error()
	}
	url := fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s/binding", b.server, args.PodNamespace, args.PodName)
	request, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	request.Header.Set("Authorization", "Bearer "+b.token)
	request.Header.Set("Content-Type", "application/json")
	response, err := b.client.Do(request)
	if err != nil {
		return "binding failed: " + err.Error()
	}
	defer response.Body.Close()
	text, _ := io.ReadAll(io.LimitReader(response.Body, 200))
	if response.StatusCode >= 300 {
		return fmt.Sprintf("binding refused: %d %s", response.StatusCode, text)
	}
	return ""
}

func decode(w http.ResponseWriter, r *http.Request, into any) error {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(into); err != nil {
		return fmt.Errorf("bad arguments: %w", err)
	}
	return nil
}

func answer(w http.ResponseWriter, value any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(value); err != nil {
		log.Printf("answer: %v", err)
	}
}
