from slurm_hetero.cli import main

main()
