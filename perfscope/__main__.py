from perfscope.launch import run

run()
