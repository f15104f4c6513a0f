# a config file, read by configurator.py by its relative path
block_size = 8
learning_rate = 3e-3
