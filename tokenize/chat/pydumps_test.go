package chat

import "testing"

// Python's json.dumps and repr, as vLLM applies them (serving.py, _convert_tool_use_block
// and _convert_tool_result_block).
func TestPyJSONDumpsAndRepr(t *testing.T) {
	cases := []struct{ in, dumps, repr string }{
		{`{"b":1,"a":"x"}`, `{"b": 1, "a": "x"}`, `{'b': 1, 'a': 'x'}`},
		{`[1.0,100.0,1e15,1e16,0.0001,0.00001,-2.5e-7,123456789.125]`, `[1.0, 100.0, 1000000000000000.0, 1e+16, 0.0001, 1e-05, -2.5e-07, 123456789.125]`, `[1.0, 100.0, 1000000000000000.0, 1e+16, 0.0001, 1e-05, -2.5e-07, 123456789.125]`},
		{`[true,false,null]`, `[true, false, null]`, `[True, False, None]`},
		{`"é😀"`, `"\u00e9\ud83d\ude00"`, `'é😀'`},
		{`"it's"`, `"it's"`, `"it's"`},
		{`"it's \"x\""`, `"it's \"x\""`, `'it\'s "x"'`},
		{`"tab\tnl\ncr\rbs\\ \u0001\u007f"`, `"tab\tnl\ncr\rbs\\ \u0001\u007f"`, `'tab\tnl\ncr\rbs\\ \x01\x7f'`},
		{`{}`, `{}`, `{}`},
	}
	for _, tc := range cases {
		v, err := decodeValue([]byte(tc.in))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := PyJSONDumps(v); err != nil || got != tc.dumps {
			t.Errorf("dumps(%s) = %s, %v, want %s", tc.in, got, err, tc.dumps)
		}
		if got := PyRepr(v); got != tc.repr {
			t.Errorf("repr(%s) = %s, want %s", tc.in, got, tc.repr)
		}
	}
}
