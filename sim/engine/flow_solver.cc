// flow solver
