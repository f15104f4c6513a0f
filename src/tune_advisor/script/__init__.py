"""Script mode: measure an unmodified training script (`tune-advisor analyze train.py -- ARGS`) from outside its code.

flags.py   --map KNOB=FLAG[:VALUE]: knobs set through the script's own flags; the recommended command line
hooks.py   the patches inside the probe child: DataLoader, optimizer steps, the model, the loss, processes, stdin
driver.py  runs the script in the probe child (runpy) and measures its optimizer steps; inspect mode
group.py   the script's own process group (a script written for torchrun): a world of one, DDP knobs, its destroy
"""
