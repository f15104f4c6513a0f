"""nanoGPT's configurator, written anew: `python train.py config/x.py --key=value`, exec'd by train.py."""
import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if "=" not in arg:
        assert not arg.startswith("--"), arg
        exec(open(arg).read())  # a config file
    else:
        assert arg.startswith("--"), arg
        key, val = arg[2:].split("=", 1)
        assert key in globals(), f"unknown config key {key}"
        try:
            attempt = literal_eval(val)
        except (SyntaxError, ValueError):
            attempt = val
        assert type(attempt) == type(globals()[key]), f"{key}: {attempt!r}"
        globals()[key] = attempt
