package main

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// This file drives a headless Chromium through the DevTools protocol, with
// a minimal hand-written websocket client (text frames, client masking), so
// the tests need no Go dependency for it.

const chromiumPath = "/usr/bin/chromium"

// browser is a headless Chromium with one page, driven over DevTools.
type browser struct {
	t    *testing.T
	cmd  *exec.Cmd
	done chan struct{}
	ws   *wsConn

	mu      sync.Mutex // guards nextID, pending
	nextID  int
	pending map[int]chan cdpReply
	readErr error
	readers sync.WaitGroup
}

type cdpReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// startBrowser starts Chromium and attaches to its page. It skips the test,
// loudly, when Chromium is not installed.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		msg := fmt.Sprintf("SKIPPING browser test %s: %s not found (%v); install it with apt-get install -y chromium", t.Name(), chromiumPath, err)
		fmt.Fprintln(os.Stderr, msg)
		if os.Getenv("SOVEREIGN_REQUIRE_CHROMIUM") != "" {
			t.Fatal(msg + " (SOVEREIGN_REQUIRE_CHROMIUM is set, so this is a failure)")
		}
		t.Skip(msg)
	}
	profile := t.TempDir()
	cmd := exec.Command(chromiumPath, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
		"--user-data-dir="+profile, "--remote-debugging-port=0", "--window-size=1200,900", "about:blank")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	b := &browser{t: t, cmd: cmd, done: make(chan struct{}), pending: make(map[int]chan cdpReply)}
	endpoint := make(chan string, 1)
	var logMu sync.Mutex
	var log []string
	b.readers.Go(func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			log = append(log, line)
			logMu.Unlock()
			if u, ok := strings.CutPrefix(line, "DevTools listening on "); ok {
				endpoint <- u
			}
		}
	})
	go func() {
		b.readers.Wait()
		cmd.Wait()
		close(b.done)
	}()
	t.Cleanup(func() {
		if b.ws != nil {
			b.ws.Close()
		}
		cmd.Process.Kill()
		<-b.done
		if t.Failed() {
			logMu.Lock()
			t.Logf("chromium stderr:\n%s", strings.Join(log, "\n"))
			logMu.Unlock()
		}
	})
	var browserWS string
	select {
	case browserWS = <-endpoint:
	case <-b.done:
		t.Fatal("chromium exited before it listened for DevTools")
	case <-time.After(wait):
		t.Fatalf("chromium did not listen for DevTools within %v", wait)
	}
	u, err := url.Parse(browserWS)
	if err != nil {
		t.Fatal(err)
	}
	pageWS := b.pageTarget(u.Host)
	ws, err := dialWS(pageWS)
	if err != nil {
		t.Fatalf("websocket to %s: %v", pageWS, err)
	}
	b.ws = ws
	b.readers.Go(b.readLoop)
	return b
}

// pageTarget returns the websocket URL of the browser's page.
func (b *browser) pageTarget(host string) string {
	b.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		resp, err := http.Get("http://" + host + "/json/list")
		if err == nil {
			var targets []struct {
				Type string `json:"type"`
				WS   string `json:"webSocketDebuggerUrl"`
			}
			err = json.NewDecoder(resp.Body).Decode(&targets)
			resp.Body.Close()
			for _, tg := range targets {
				if tg.Type == "page" && tg.WS != "" {
					return tg.WS
				}
			}
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("no page target in chromium: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // polling chromium's target list, not synchronising test code
	}
}

func (b *browser) readLoop() {
	for {
		msg, err := b.ws.ReadMessage()
		if err != nil {
			b.mu.Lock()
			b.readErr = err
			for id, ch := range b.pending {
				close(ch)
				delete(b.pending, id)
			}
			b.mu.Unlock()
			return
		}
		var m struct {
			ID int `json:"id"`
			cdpReply
		}
		if json.Unmarshal(msg, &m) != nil || m.ID == 0 {
			continue // an event
		}
		b.mu.Lock()
		ch := b.pending[m.ID]
		delete(b.pending, m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- m.cdpReply
		}
	}
}

// call sends a DevTools command and decodes its result into out (if not nil).
func (b *browser) call(method string, params any, out any) error {
	b.mu.Lock()
	if b.readErr != nil {
		b.mu.Unlock()
		return b.readErr
	}
	b.nextID++
	id := b.nextID
	ch := make(chan cdpReply, 1)
	b.pending[id] = ch
	b.mu.Unlock()
	msg, _ := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	if err := b.ws.WriteText(msg); err != nil {
		return err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return fmt.Errorf("%s: connection closed", method)
		}
		if r.Error != nil {
			return fmt.Errorf("%s: %s", method, r.Error.Message)
		}
		if out != nil {
			return json.Unmarshal(r.Result, out)
		}
		return nil
	case <-time.After(wait):
		return fmt.Errorf("%s: no reply within %v", method, wait)
	}
}

// eval evaluates a JavaScript expression (awaiting a promise) and returns
// its value as JSON.
func (b *browser) eval(expr string) (json.RawMessage, error) {
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := b.call("Runtime.evaluate", map[string]any{"expression": expr, "awaitPromise": true, "returnByValue": true}, &r); err != nil {
		return nil, err
	}
	if r.Exception != nil {
		return nil, fmt.Errorf("javascript: %s %s", r.Exception.Text, r.Exception.Exception.Description)
	}
	return r.Result.Value, nil
}

// screenshot returns a PNG of the page.
func (b *browser) screenshot() ([]byte, error) {
	var r struct {
		Data string `json:"data"`
	}
	if err := b.call("Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &r); err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(r.Data)
}

// wsConn is a client websocket connection (RFC 6455), enough for DevTools:
// it sends masked text frames and reads unmasked, possibly fragmented,
// text frames; it answers pings.
type wsConn struct {
	c  net.Conn
	r  *bufio.Reader
	mu sync.Mutex // guards writes
}

func dialWS(raw string) (*wsConn, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	c, err := net.DialTimeout("tcp", u.Host, wait)
	if err != nil {
		return nil, err
	}
	var key [16]byte
	rand.Read(key[:])
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n",
		u.RequestURI(), u.Host, base64.StdEncoding.EncodeToString(key[:]))
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		return nil, fmt.Errorf("websocket handshake: %s", resp.Status)
	}
	return &wsConn{c: c, r: r}, nil
}

func (w *wsConn) Close() error { return w.c.Close() }

// writeFrame sends one masked frame.
func (w *wsConn) writeFrame(opcode byte, payload []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	hdr := []byte{0x80 | opcode}
	switch n := len(payload); {
	case n < 126:
		hdr = append(hdr, 0x80|byte(n))
	case n < 1<<16:
		hdr = append(hdr, 0x80|126, byte(n>>8), byte(n))
	default:
		hdr = append(hdr, 0x80|127)
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(n))
	}
	var mask [4]byte
	rand.Read(mask[:])
	hdr = append(hdr, mask[:]...)
	masked := make([]byte, len(payload))
	for i, c := range payload {
		masked[i] = c ^ mask[i%4]
	}
	_, err := w.c.Write(append(hdr, masked...))
	return err
}

// WriteText sends a text message.
func (w *wsConn) WriteText(p []byte) error { return w.writeFrame(0x1, p) }

// ReadMessage returns the next text or binary message.
func (w *wsConn) ReadMessage() ([]byte, error) {
	var msg []byte
	for {
		var h [2]byte
		if _, err := io.ReadFull(w.r, h[:]); err != nil {
			return nil, err
		}
		fin, opcode := h[0]&0x80 != 0, h[0]&0x0f
		n := uint64(h[1] & 0x7f)
		switch n {
		case 126:
			var b [2]byte
			if _, err := io.ReadFull(w.r, b[:]); err != nil {
				return nil, err
			}
			n = uint64(binary.BigEndian.Uint16(b[:]))
		case 127:
			var b [8]byte
			if _, err := io.ReadFull(w.r, b[:]); err != nil {
				return nil, err
			}
			n = binary.BigEndian.Uint64(b[:])
		}
		var mask []byte
		if h[1]&0x80 != 0 {
			mask = make([]byte, 4)
			if _, err := io.ReadFull(w.r, mask); err != nil {
				return nil, err
			}
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(w.r, payload); err != nil {
			return nil, err
		}
		if mask != nil {
			for i := range payload {
				payload[i] ^= mask[i%4]
			}
		}
		switch opcode {
		case 0x8: // close
			return nil, errors.New("websocket closed by peer")
		case 0x9: // ping
			if err := w.writeFrame(0xA, payload); err != nil {
				return nil, err
			}
			continue
		case 0xA: // pong
			continue
		}
		msg = append(msg, payload...)
		if fin {
			return msg, nil
		}
	}
}
