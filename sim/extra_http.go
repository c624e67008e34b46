package sim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// version is what GET /version reports: the vLLM release whose wire format the defaults follow.
const version = "0.26.0+vllm-sim"

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// handleTokenize is vLLM's POST /tokenize (chat form with "messages", completion form with
// "prompt"): the exact prompt token ids the engine would prefill
// (vllm/entrypoints/openai/serving_tokenization.py).
func (w *Worker) handleTokenize(rw http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxBodyBytes))
	if err != nil {
		writeError(rw, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	var b struct {
		Model          string `json:"model"`
		ReturnTokenStr bool   `json:"return_token_strs"`
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		writeError(rw, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	if b.Model != "" && b.Model != w.opts.ServedModelName {
		if _, ok := w.loras.id(b.Model); !ok {
			writeError(rw, http.StatusNotFound, "The model `"+b.Model+"` does not exist.")
			return
		}
	}
	ids, err := w.tok.tokenizeRequest(r.Context(), raw)
	if err != nil {
		var bad *badRequestError
		if errors.As(err, &bad) {
			writeError(rw, http.StatusBadRequest, bad.msg)
			return
		}
		writeError(rw, http.StatusInternalServerError, "tokenize: "+err.Error())
		return
	}
	resp := tokenizeResponse{Count: len(ids), MaxModelLen: w.opts.MaxModelLen, Tokens: ids}
	if resp.Tokens == nil {
		resp.Tokens = []uint32{}
	}
	if b.ReturnTokenStr {
		if d, ok := w.tok.(detokenizer); ok {
			for _, id := range ids {
				s, err := d.decode([]uint32{id})
				if err != nil {
					writeError(rw, http.StatusBadRequest, err.Error())
					return
				}
				resp.TokenStrs = append(resp.TokenStrs, s)
			}
		}
	}
	writeJSON(rw, http.StatusOK, resp)
}

// detokenizer is implemented by tokenizers that can turn ids back into text.
type detokenizer interface {
	decode(ids []uint32) (string, error)
}

// handleDetokenize is vLLM's POST /detokenize: {"tokens": [...]} → {"prompt": "..."}.
func (w *Worker) handleDetokenize(rw http.ResponseWriter, r *http.Request) {
	var b struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(rw, r.Body, maxBodyBytes)).Decode(&b); err != nil {
		writeError(rw, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	d, ok := w.tok.(detokenizer)
	if !ok {
		writeError(rw, http.StatusNotImplemented, "detokenize needs a tokenizer (--model)")
		return
	}
	text, err := d.decode(b.Tokens)
	if err != nil {
		writeError(rw, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(rw, http.StatusOK, map[string]string{"prompt": text})
}
