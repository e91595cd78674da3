"""What a run is asked to do: RunConfig, every knob checked once (run_config, rules), the task
registry (tasks) and profiles, YAML grids of validated points (profiles); the project folder and
where a relative path points (paths), a notebook's parameters cell (notebook_cells), a
profile's grid frozen for a job array and its chains of dependent points (grids).
Imports nothing of the kit but the method registry's table (kit.methods, data only): the layer
every other one reads."""
