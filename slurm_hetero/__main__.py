from slurm_hetero.entry import main

main()
